"""The MoE fuzz seed (runtime/tests/fuzz_seeds/ernie_moe_ep2_train.ernie): a
tiny ERNIE-4.5 MoE (capacity drops, aux-free balancing) trained on ep 2, so
ernie-fuzz-program mutates the MoE kernels, their signature checks and the
all-to-alls. Regenerate when the program format changes:

    .venv/bin/python scripts/make_moe_fuzz_seed.py [OUT]
"""
import sys, numpy as np
sys.path.insert(0, "build/python")
import ernie, ernie.distributed as dist
from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
cfg = Ernie4_5Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, moe_num_experts=4, moe_k=2,
                     moe_num_shared_experts=1, moe_intermediate_size=8, moe_capacity_factor=1.0,
                     router_aux_loss_coef=0.01, moe_aux_free_rate=1e-3,
                     pre_shifted_labels=True)  # the labels below come shifted (np.roll)
ids = np.random.default_rng(0).integers(0, 32, (4, 8)); labels = np.roll(ids, -1, 1)
prog = ernie.compile(Ernie4_5_MoeForCausalLM(cfg), ernie.optimizer.AdamW(1e-2), [ids, labels],
                     mesh=dist.ProcessMesh([0, 1], ["ep"]), config={"ep_config": {"axis": "ep"}})
data = prog.program_file

open(sys.argv[1] if len(sys.argv) > 1 else "runtime/tests/fuzz_seeds/ernie_moe_ep2_train.ernie", "wb").write(data)
