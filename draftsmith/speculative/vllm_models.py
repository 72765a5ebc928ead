"""vLLM model classes for targets vLLM 0.22 does not register (imported by vLLM only, through
`vllm_plugin.register`; never by draftsmith's own code, which runs without vLLM).

Qwen3.5/3.6 checkpoints saved as text-only causal LMs (`Qwen3_5ForCausalLM`, model_type `qwen3_5_text`, as
draftsmith's converter and the presets' shapes write them; `Qwen3_5MoeForCausalLM` for the MoE ones) load with
vLLM's own classes of those names, but they do not declare themselves hybrid: without it vLLM would size no
recurrent (Gated DeltaNet) state. The state's dtype, shape and copy come from the vision-language class, which
declares them."""

from __future__ import annotations

from typing import Any

from vllm.model_executor.models.interfaces import IsHybrid
from vllm.model_executor.models.qwen3_5 import (
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForCausalLM,
)


class _RecurrentState:
    """The recurrent state's dtype, shape and copy, as the vision-language class declares them."""

    get_mamba_state_dtype_from_config: Any = classmethod(
        Qwen3_5ForConditionalGeneration.get_mamba_state_dtype_from_config.__func__
    )
    get_mamba_state_shape_from_config: Any = classmethod(
        Qwen3_5ForConditionalGeneration.get_mamba_state_shape_from_config.__func__
    )
    get_mamba_state_copy_func: Any = classmethod(
        Qwen3_5ForConditionalGeneration.get_mamba_state_copy_func.__func__
    )


class Qwen3_5TextForCausalLM(_RecurrentState, Qwen3_5ForCausalLM, IsHybrid):
    pass


class Qwen3_5MoeTextForCausalLM(_RecurrentState, Qwen3_5MoeForCausalLM, IsHybrid):
    pass
