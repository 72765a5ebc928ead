"""What draftsmith adds to vLLM, loaded by vLLM in each of an engine's processes through the
`vllm.general_plugins` entry point (pyproject.toml), and by the engine bench's passes: the text-only
Qwen3.5/3.6 classes, dense and MoE, registered as the hybrids they are. vLLM 0.22 ships both classes but
registers only the vision-language and MTP architectures of Qwen3.5."""

from __future__ import annotations

# architecture -> the class vLLM imports lazily for it (draftsmith.speculative.vllm_models)
TEXT_HYBRIDS = {
    "Qwen3_5ForCausalLM": "draftsmith.speculative.vllm_models:Qwen3_5TextForCausalLM",
    "Qwen3_5MoeForCausalLM": "draftsmith.speculative.vllm_models:Qwen3_5MoeTextForCausalLM",
}
# the config hook vLLM runs for the vision-language classes: it keeps the recurrent state in the checkpoint's
# `mamba_ssm_dtype` (float32 in Qwen3.5's configs) rather than the weights' dtype
STATE_DTYPE_HOOK_OF = "Qwen3_5ForConditionalGeneration"


def register() -> None:
    """Registers each class where vLLM has none for the architecture, with the state-dtype hook; safe to call
    in every process."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    for arch, cls in TEXT_HYBRIDS.items():
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, cls)
        MODELS_CONFIG_MAP.setdefault(arch, MODELS_CONFIG_MAP[STATE_DTYPE_HOOK_OF])
