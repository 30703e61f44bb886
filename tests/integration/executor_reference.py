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


def reference_2bw_losses(plan, steps: int, *, lr: float = LR) -> list[float]:
    """PipeDream-2BW's delayed update in one process (Narayanan et al. 2021, sec. 3.1), written independently of
    the executor: `model` holds W(t) and the only optimizer; `shadow` holds W(t-1), on which step t's global batch
    (split into the plan's micro-batches) is evaluated; its gradient is moved onto `model` and stepped:
    W(t+1) = W(t) - lr * grad f(W(t-1)), with W(0) = W(1). Returns step t's loss at W(t-1)."""
    import torch

    from planner.executor.parallelize import build_optimizer
    from planner.executor.train import cross_entropy

    spec, m = plan.request.model, plan.batch.num_microbatches
    model, shadow = reference_model(spec, plan.batch.seq_len), reference_model(spec, plan.batch.seq_len)
    opt = build_optimizer(model, zero_stage=0, lr=lr)
    batches, losses = batches_of(plan), []
    for step in range(1, steps + 1):
        inputs, targets = batches.global_batch(step)
        shadow.zero_grad(set_to_none=True)
        total = 0.0
        for x, y in zip(inputs.chunk(m), targets.chunk(m)):
            loss = cross_entropy(shadow(x), y) / m
            loss.backward()
            total += float(loss.detach())
        losses.append(total)
        with torch.no_grad():
            for p, s in zip(model.parameters(), shadow.parameters()):
                p.grad = s.grad.clone()
                s.copy_(p)  # shadow <- W(t), the weights step t+1 evaluates
        opt.step()  # model: W(t+1)
        opt.zero_grad(set_to_none=True)
    return losses
