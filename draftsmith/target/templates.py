"""The chat templates `target.chat_template` can name, and the text of the one it names. Apart from the
model loader so that the parse-time checks read them without importing torch."""

from __future__ import annotations

from pathlib import Path

# `target.chat_template` values that are not a file: none at all (a base model: prompt and answer
# concatenated, eos appended), or ChatML (<|im_start|>role ... <|im_end|>) for tokenizers that have its
# markers but ship no template (many converted and base checkpoints). null keeps the tokenizer's own.
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
NAMED_TEMPLATES = {"chatml": CHATML, "plain": None}


def chat_template_text(setting: str) -> str | None:
    """The template a `target.chat_template` value names: a built-in name or a Jinja file."""
    if setting in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[setting]
    path = Path(setting).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"target.chat_template: {setting!r} is neither {' nor '.join(NAMED_TEMPLATES)} nor a Jinja file"
        )
    return path.read_text()
