"""AMD presets with a measured flash kernel (ck-v3): what context parallelism and config
emission make of it."""

import pytest

from perfmodel.errors import PlanError
from perfmodel.predict import predict
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.model import load_model


def test_cp_refusal_names_the_head_size_auto_left_unfused(tmp_path):
    """A head size above the kernel's max_head_dim makes --attention auto attend unfused; the
    refusal of cp said 'the hardware has none for this dtype or --attention unfused was given',
    neither of which was so on MI300X (ck-v3 runs bf16): it names the head size and the limit.
    --attention unfused given, and MI325X (no kernel), keep the old wording."""
    spec = tmp_path / "wide.yaml"
    spec.write_text("base: llama3-8b\nhead_dim: 320\n")
    plan = dict(gpus=8, dp=4, cp=2, global_batch=4)
    with pytest.raises(PlanError, match=r"cp 2 needs fused .*head_dim 320 is above the 256 "
                                        r"flash kernels run, so --attention auto attends"):
        predict(str(spec), "mi300x", plan)
    with pytest.raises(PlanError, match=r"--attention unfused was given$"):
        predict(str(spec), "mi300x", {**plan, "flash_attention": False})
    with pytest.raises(PlanError, match=r"the hardware has none for this dtype"):
        predict("llama3-8b", "mi325x", plan)


@pytest.mark.parametrize("hardware,kernel", [("mi300x", None), ("mi300x", "ck-v3-a16"),
                                             ("mi355x", None), ("mi355x", "ck-v3-a32"),
                                             ("dgx-h100", "fa2")])
def test_megatron_writes_te_fused_backend_for_ck_kernels(tmp_path, hardware, kernel):
    """ck-v3 is Transformer Engine on ROCm's fused attention (its CK backend): written as
    --attention-backend flash, Megatron-LM set NVTE_FUSED_ATTN=0 and the job ran ROCm's
    flash-attn package, not the kernel perfmodel costed. CK kernels are written as fused;
    FlashAttention-2 stays flash."""
    from perfmodel.configs.megatron import write_megatron
    from perfmodel.strategy import plan_from_dict

    plan = plan_from_dict(dict(gpus=8, dp=8, global_batch=8, flash_attention=True,
                               attention_kernel=kernel))
    write_megatron(tmp_path, load_model("llama3-8b"), plan, load_hardware(hardware), [])
    args = (tmp_path / "megatron_args.txt").read_text().split()
    expected = "flash" if kernel == "fa2" else "fused"
    assert args[args.index("--attention-backend") + 1] == expected
