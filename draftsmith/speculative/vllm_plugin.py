"""What draftsmith adds to vLLM, loaded by vLLM in each of an engine's processes through the
`vllm.general_plugins` entry point (pyproject.toml), and by the engine bench's passes: the text-only
Qwen3.5/3.6 class registered as the hybrid it is. vLLM 0.22 ships the class but registers only the
vision-language and MTP architectures of Qwen3.5."""

from __future__ import annotations

TEXT_HYBRID = "Qwen3_5ForCausalLM"
TEXT_HYBRID_CLASS = "draftsmith.speculative.vllm_models:Qwen3_5TextForCausalLM"  # imported lazily by vLLM


def register() -> None:
    """Registers the class where vLLM has none for the architecture; safe to call in every process."""
    from vllm import ModelRegistry

    if TEXT_HYBRID not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(TEXT_HYBRID, TEXT_HYBRID_CLASS)
