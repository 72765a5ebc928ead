"""The one sampler: the next token from logits, greedy at temperature 0, else temperature and top-p."""

from __future__ import annotations

import torch


def pick(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Greedy at temperature 0, else a sample from the temperature-scaled distribution cut to its top-p mass.

    `logits` is [V] or [N, V]; the result is [] or [N]. Sampling happens on the generator's device, so a
    seeded CPU generator gives the same draws whatever device the logits are on.
    """
    if temperature <= 0:
        return logits.argmax(-1)
    if logits.dim() == 1:
        return pick(logits[None], temperature, top_p, generator)[0]
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        sorted_p[(sorted_p.cumsum(-1) - sorted_p) > top_p] = 0.0  # keep the smallest prefix reaching top_p
        choice = torch.multinomial(sorted_p, 1, generator=generator)
        return order.gather(-1, choice)[:, 0]
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
