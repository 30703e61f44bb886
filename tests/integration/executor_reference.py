"""Single-process references for the executor tests, and the loss comparison they share.

`reference_losses` trains the full seeded model in this process on the same global batches the executor
draws (planner.executor.data), with the executor's optimizer: the synchronous update every layout must
reproduce. The comparison reports the ratio of the largest loss difference to how far the loss moved, so
a test is known to be able to fail (the movement must dwarf the tolerance).
"""

from __future__ import annotations

LR, SEED, REL_TOL = 1e-2, 0, 1e-5


def reference_model(spec, seq_len: int):
    """The full model, initialised as every layout initialises it; a tied head must share the embedding's storage."""
    from planner.nn import Transformer

    model = Transformer(spec, max_seq_len=seq_len)
    model.init_weights(SEED)
    if spec.tied_embeddings:
        assert model.output.weight.data_ptr() == model.tok_embeddings.weight.data_ptr(), "reference head is untied"
    return model


def batches_of(plan):
    from planner.executor.data import Batches, BatchSource

    spec, batch = plan.request.model, plan.batch
    return Batches(BatchSource(vocab_size=spec.vocab_size, global_batch_size=batch.global_batch_size,
                               seq_len=batch.seq_len, seed=SEED))


def reference_losses(plan, steps: int, *, lr: float = LR) -> list[float]:
    """Single process, no process group: the full model on the whole global batch of each step."""
    from planner.executor.parallelize import build_optimizer
    from planner.executor.train import train_steps

    model = reference_model(plan.request.model, plan.batch.seq_len)
    opt = build_optimizer(model, zero_stage=0, lr=lr)
    batches = batches_of(plan)
    return [train_steps(model, opt, [batches.global_batch(step)])[0] for step in range(1, steps + 1)]


def assert_close(got, ref, name: str, rel_tol: float = REL_TOL) -> float:
    """Per-step relative equality; returns max |got - ref| / (max(ref) - min(ref)), the ratio of the largest
    difference to the loss movement (asserted well below 1: the comparison is not vacuous)."""
    assert len(got) == len(ref), f"{name}: {len(got)} losses, expected {len(ref)}"
    bad = [f"step {i + 1}: got {g:.8f}, reference {r:.8f}" for i, (g, r) in enumerate(zip(got, ref)) if abs(g - r) > rel_tol * abs(r)]
    assert not bad, f"{name}: " + "; ".join(bad)
    movement = max(ref) - min(ref)
    assert movement > 100 * rel_tol * max(abs(r) for r in ref), f"{name}: the loss moved by {movement:.3g} only"
    return max(abs(g - r) for g, r in zip(got, ref)) / movement
