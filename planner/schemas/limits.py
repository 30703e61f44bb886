"""Size limits of every input the planner takes, from a file, a flag or an HTTP body.

Why: a search is polynomial in these sizes, and a few absurd values (a 10^27 global batch, a million layers)
made a solve hang or take gigabytes before any check. Each limit is far above any model or cluster that
exists (the largest shipped preset has 126 layers, hidden 20480, 256 experts, seq_len 65536), so a real
input never meets one; a value above one is refused up front (exit 2, HTTP 422) naming the field.
"""

MAX_LAYERS = 1024
MAX_MTP_LAYERS = 16  # multi-token prediction depth (DeepSeek-V3 uses 1)
MAX_HIDDEN_SIZE = 1 << 17  # 131072
MAX_FFN_HIDDEN_SIZE = 1 << 20
MAX_HEADS = 4096
MAX_HEAD_DIM = 4096
MAX_VOCAB_SIZE = 1 << 23  # 8M tokens
MAX_SEQ_LEN = 1 << 24  # 16M tokens (Llama 4 Scout declares 10M positions)
MAX_EXPERTS = 4096
MAX_GLOBAL_BATCH_SIZE = 1 << 24  # sequences per step
MAX_GPUS = 1 << 20
MAX_NODES = 1 << 17
MAX_GPUS_PER_NODE = 1024
MAX_DEGREE = MAX_GPUS  # any parallel degree or micro-batch size
MAX_TIME_LIMIT_S = 24 * 3600.0
MAX_TOP_K = 50
MAX_LATENCY_S = 1.0  # a fabric's fixed time per step: microseconds in practice (1e308 overflowed to NaN step times)
MAX_CAPACITY_FACTOR = float(MAX_EXPERTS)  # at capacity_factor >= num_experts / top_k no token is dropped: larger is dropless
