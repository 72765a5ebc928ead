"""The batched decoding engine that regenerates responses: a batch served the way an inference engine serves
one.

DFlash drafters learn the target's own answers, so the extraction job first replaces each last assistant turn
with what the target says. Transformers' `generate` decodes one fixed batch until its longest answer ends,
grows its cache by concatenation, and synchronises with the host every step. Here, inside Transformers and
torch:

- a fixed number of *slots* decode together; each has a preallocated region of a key/value cache (attention
  layers) and its own Gated DeltaNet convolution and recurrent state (linear-attention layers), so a decode
  step has static shapes and writes in place;
- a slot whose answer ends is refilled with the next prompt at the next check (continuous batching): nobody
  waits for the longest answer;
- the step keeps its bookkeeping (positions, counts, stop flags, output tokens) on the device; the host looks
  every `sync_every` steps only to retire finished answers and admit new prompts;
- new prompts are prefilled together, left-padded (exact for both layer kinds: padded positions are masked in
  attention and zeroed before the convolution and the recurrence), and their caches copied into the free
  slots.

The model's own decoder layers run every step (no second implementation of the model): the slot cache answers
the calls they make on a Transformers cache (`update` for attention, the conv/recurrent state accessors for
Gated DeltaNet), and each slot attends to its own prefix through a per-row mask.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from draftsmith.core.runtime import sync_device
from draftsmith.engine.attention import (
    DECODE_ATTENTION,
    _attention_configs,
    _step_positions,
    decode_attention,
)
from draftsmith.engine.kernels import available, fused_decode, packed_prefill
from draftsmith.engine.slots import SlotCache
from draftsmith.target.fusion import fused_modules, kernel_modules
from draftsmith.target.layers import (
    body,
    cache_kwarg,
    layer_types,
    mixer_module,
    names_sliding_layers,
    sliding_window,
)
from draftsmith.target.sampling import pick

PREFILL_TOKENS = 16384  # prompt tokens prefilled together at most (a group's activations and states)


@dataclass
class RegenStats:
    prompts: int = 0
    new_tokens: int = 0
    steps: int = 0
    prefill_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    admissions: list = field(default_factory=list)  # (prompts prefilled together, seconds) per admission

    @property
    def new_tokens_per_s(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens over the time not spent in prefill: what the decode loop alone sustains."""
        return self.new_tokens / max(self.seconds - self.prefill_seconds, 1e-9)

    def summary(self) -> str:
        return (
            f"{self.prompts} answers, {self.new_tokens} new tokens in {self.seconds:.1f}s "
            f"({self.new_tokens_per_s:.0f} new tokens/s, {self.decode_tokens_per_s:.0f} while decoding; "
            f"{self.steps} decode steps, prefill {self.prefill_tokens} tokens in {self.prefill_seconds:.1f}s)"
        )

    def admission_summary(self) -> str:
        """Per group size: how many admissions, their seconds in all and the slowest (a first one of a size
        pays for compiling kernels specialised on it)."""
        sizes = sorted({n for n, _ in self.admissions})
        parts = []
        for n in sizes:
            t = [s for m, s in self.admissions if m == n]
            parts.append(f"{n}: {len(t)}x {sum(t):.2f}s (max {max(t):.2f}s)")
        return "admissions by group size: " + ", ".join(parts)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one left-padded batch: ids and the attention mask (1 on real tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        att[r, width - len(p) :] = 1
    return ids, att


def _cache_kinds(model) -> list[str]:
    """What each layer keeps in the slot cache: recurrent state (linear attention) or keys and values."""
    return ["linear_attention" if "linear" in t else "full_attention" for t in layer_types(model)]


class Engine:
    """Greedy or sampled decoding of many prompts through `slots` concurrent sequences of a Transformers
    model."""

    def __init__(
        self,
        model,
        slots: int,
        max_len: int,
        eos_ids: list[int],
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        sync_every: int = 8,
        prefill_tokens: int = PREFILL_TOKENS,
        pad_id: int = 0,
        cuda_graph: bool = False,
        fused_kernels: bool = True,
        pow2_groups: bool = True,
        min_refill: int = 1,
        packed: bool = False,
        layer_kernels: bool = True,
    ):
        self.model = model
        self.device = next(model.parameters()).device
        self.types = _cache_kinds(model)
        # sliding-window layers keep every position in their slots (the prefill hands over only the last
        # window) and are masked to the window each step
        self.window = sliding_window(model)
        self.final_softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self.slots, self.max_len, self.sync_every, self.prefill_tokens = (
            slots,
            max_len,
            sync_every,
            prefill_tokens,
        )
        self.group_rows = -(
            -slots // 4
        )  # prompts prefilled together: bounds the prefill's copy of their states
        # fla's prefill kernels are compiled and autotuned once per batch size (it is a constexpr there):
        # refills of 1, 2, 3, ... prompts would pay that (1 to 12 s on the 27B shape, one H200) for each new
        # size, so groups are cut to powers of two
        self.pow2_groups = pow2_groups
        # an admission costs about the same for 1 prompt as for 16 on a small target: with min_refill k, free
        # slots wait until k of them (or the rest of the queue) can be filled at once, unless none decode
        self.min_refill = max(1, min_refill)
        # packed: a prefill group's Gated DeltaNet chunks run as one row of segments
        # (engine.kernels.as_segments), so that fla compiles for one batch size whatever the group's; off
        # until measured on a GPU
        self._packed_mixer = mixer_module(model) if packed else None
        self.packed_calls = (
            0  # Gated DeltaNet chunk calls run packed (none on the CPU, nor without such layers)
        )
        self.temperature, self.top_p, self.pad_id = temperature, top_p, pad_id
        self.eos = torch.as_tensor(sorted(set(eos_ids)) or [-1], device=self.device)
        head = model.get_output_embeddings().weight.device  # where the logits are (the last GPU of a group)
        self.generator = torch.Generator(device=head).manual_seed(seed) if temperature > 0 else None
        self._allocate(slots, max_len, pad_id)
        self._set_up_kernels(
            model, cuda_graph=cuda_graph, fused_kernels=fused_kernels, layer_kernels=layer_kernels
        )

    def _allocate(self, slots: int, max_len: int, pad_id: int) -> None:
        """The slots' cache and per-slot state, on the model's first device."""
        self.cache = SlotCache(self.types, slots, max_len, self.device)
        d = self.device
        self.cur = torch.full((slots,), pad_id, dtype=torch.long, device=d)  # the token each slot feeds next
        self.n_gen = torch.zeros(slots, dtype=torch.long, device=d)
        self.limit = torch.zeros(slots, dtype=torch.long, device=d)  # new-token cap of each slot's answer
        self.live = torch.zeros(slots, dtype=torch.bool, device=d)
        self.out = torch.full(
            (slots, max_len + 1), pad_id, dtype=torch.long, device=d
        )  # last column: scratch
        self._cols = torch.arange(max_len, device=d)

    def _set_up_kernels(self, model, *, cuda_graph: bool, fused_kernels: bool, layer_kernels: bool) -> None:
        """The CUDA graph's switch, the attention interface and masks, and the Triton kernels a GPU runs."""
        # one decode step replayed as a CUDA graph (greedy only: sampling would need the generator in the
        # graph)
        devices = {p.device for p in model.parameters()}
        one_gpu = len(devices) == 1  # a graph is captured on one device
        self.cuda_graph = cuda_graph and self.device.type == "cuda" and self.temperature <= 0 and one_gpu
        self.graph: torch.cuda.CUDAGraph | None = None
        self.cache.static = self.cuda_graph
        self._body = body(model)
        self._cache_kw = cache_kwarg(self._body)
        # hybrid models and those naming sliding layers take one mask per layer kind; the others one 4D mask
        # (the sliding one where a config gives a window and no layer kinds: then every layer slides)
        self._mask_by_kind = "linear_attention" in self.types or names_sliding_layers(model)
        from transformers import AttentionInterface

        AttentionInterface.register(DECODE_ATTENTION, decode_attention)
        self._configs = _attention_configs(model)
        # on a GPU the step's attention and Gated DeltaNet updates run on Triton kernels (engine.kernels)
        self.fused = fused_kernels and available(self.device)
        self._mixer = mixer_module(model) if self.fused else None
        # prefills' and decode steps' RMSNorms and gated MLP products as one kernel each (target.fusion)
        self._kernel_modules = kernel_modules(model) if self.fused and layer_kernels else []
        self.layer_kernels = bool(self._kernel_modules)
        # the slot positions the Triton attention reads, on every device of the model (refreshed in place each
        # step, so a captured graph keeps reading the same tensors)
        self._pos_copies = {
            dev: torch.empty_like(self.cache.pos, device=dev) for dev in devices - {self.device}
        }

    @torch.inference_mode()
    def _prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, Any, int]:
        ids, att = left_pad(prompts, self.pad_id)
        pos = (att.cumsum(-1) - 1).clamp_min(0)
        with packed_prefill(self._packed_mixer) as packer, fused_modules(self._kernel_modules):
            out = self.model(
                input_ids=ids.to(self.device),
                attention_mask=att.to(self.device),
                position_ids=pos.to(self.device),
                use_cache=True,
                logits_to_keep=1,
            )
        self.packed_calls += packer.calls if packer is not None else 0
        cache = out.get(
            "cache"
        )  # Transformers 5.2x; reading `past_key_values` there warns that it is deprecated
        return out.logits[:, -1], out.past_key_values if cache is None else cache, ids.shape[1]

    @torch.inference_mode()
    def _admit(self, slot_ids: list[int], prompts: list[list[int]], limits: list[int]) -> None:
        logits, pcache, width = self._prefill(prompts)
        lengths = [len(p) for p in prompts]
        self.cache.load(slot_ids, pcache, lengths, width)
        first = pick(logits.float(), self.temperature, self.top_p, self.generator).to(self.device)
        idx = torch.as_tensor(slot_ids, device=self.device)
        lim = torch.as_tensor(limits, device=self.device)
        self.out[idx] = self.pad_id
        self.out[idx, 0] = first
        self.cur[idx] = first
        self.n_gen[idx] = 1
        self.limit[idx] = lim
        self.cache.pos[idx] = torch.as_tensor(lengths, device=self.device)
        self.live[idx] = ~torch.isin(first, self.eos) & (lim > 1)

    @torch.inference_mode()
    def _capture(self) -> None:
        """Records `_step` into a CUDA graph: ~1,000 kernel launches a step for a 64-layer target become one.

        Runs before any prompt is admitted: a one-token dummy prefill creates the slot tensors, then warm-up
        and capture steps run with every slot dead. Admission later overwrites a slot's states, so nothing
        needs saving (a copy of the linear-attention states would cost as much memory as the states). Every
        tensor the step touches is allocated once, so replays stay valid.
        """
        if any(layer is None for layer in self.cache.layers):
            self._admit([0], [[self.pad_id]], [1])
        self.live.zero_()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # kernels, autotuning and allocations happen outside the capture
                self._step_eager()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step_eager()
        self.graph = graph

    @torch.inference_mode()
    def slot_bytes(self) -> tuple[int, int]:
        """What one slot costs: bytes per cached position (keys and values) and fixed bytes (linear-attention
        states), measured on a one-token prefill rather than derived from a config every model family spells
        differently."""
        _, pcache, _ = self._prefill([[self.pad_id]])
        per_position = fixed = 0
        for i, kind in enumerate(self.types):
            src = pcache.layers[i]
            if kind == "linear_attention":
                fixed += src.conv_states[0].nbytes + src.recurrent_states[0].nbytes
            else:
                per_position += src.keys.nbytes + src.values.nbytes
        return per_position, fixed

    def _step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step_eager()

    @torch.inference_mode()
    def _step_eager(self) -> None:
        """One token for every slot; only live slots advance. No host synchronisation."""
        pos = self.cache.pos
        mask = (self._cols[None, :] <= pos[:, None])[:, None, None, :]
        slide = (
            mask & (self._cols[None, :] > (pos - self.window)[:, None])[:, None, None, :]
            if self.window
            else mask
        )
        att = (
            {"full_attention": mask, "sliding_attention": slide, "linear_attention": None}
            if self._mask_by_kind
            else slide
        )
        before = [c._attn_implementation_internal for c in self._configs]
        for c in self._configs:  # the step's attention reads each slot's keys once (see decode_attention)
            c._attn_implementation_internal = DECODE_ATTENTION
        if self.fused:  # the Triton attention reads each slot's keys up to its position, not the whole cache
            for copy in self._pos_copies.values():
                copy.copy_(pos)
            _step_positions.update({self.device: pos, **self._pos_copies})
        try:
            with fused_decode(self._mixer), fused_modules(self._kernel_modules):
                hidden = self._body(
                    input_ids=self.cur[:, None],
                    attention_mask=att,
                    position_ids=pos[:, None],
                    use_cache=True,
                    **{self._cache_kw: self.cache},
                ).last_hidden_state
        finally:
            for c, name in zip(self._configs, before):
                c._attn_implementation_internal = name
            _step_positions.clear()
        logits = self.model.lm_head(hidden[:, -1]).float()
        if self.final_softcap:  # what the model's own forward does after its head (Gemma 2)
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        nxt = pick(logits, self.temperature, self.top_p, self.generator)
        nxt = nxt.to(self.device)  # a no-op unless the head sits on the last GPU of a group
        live = self.live
        col = torch.where(live, self.n_gen, self.out.shape[1] - 1)  # dead slots write to a scratch column
        self.out[self.cache._rows, col] = nxt
        step = live.long()
        self.n_gen += step
        pos += step
        self.cur.copy_(torch.where(live, nxt, self.cur))
        done = torch.isin(nxt, self.eos) | (self.n_gen >= self.limit) | (pos >= self.max_len - 1)
        self.live.copy_(live & ~done)

    def run(
        self, prompts: list[list[int]], max_new_tokens: int | list[int], progress: bool = True
    ) -> tuple[list[list[int]], RegenStats]:
        """Every prompt's answer (ending with an EOS token when one was produced), in input order."""
        n = len(prompts)
        limits = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
        limits = [max(0, min(lim, self.max_len - 1 - len(p))) if p else 0 for lim, p in zip(limits, prompts)]
        results: list[list[int]] = [[] for _ in range(n)]
        queue = deque(i for i in sorted(range(n), key=lambda i: -len(prompts[i])) if limits[i] > 0)
        owner = [-1] * self.slots
        stats = RegenStats(prompts=n)
        if self.cuda_graph and self.graph is None:
            self._capture()  # before the first admission: see _capture
        bar = tqdm(total=sum(limits), desc="regenerate", unit="tok", disable=not progress, smoothing=0.1)
        t0 = time.perf_counter()
        while queue or any(o >= 0 for o in owner):
            free = [s for s in range(self.slots) if owner[s] < 0]
            while free and queue:  # admit as many prompts as there are free slots, prefilled in groups
                if len(free) < min(self.min_refill, len(queue)) and any(o >= 0 for o in owner):
                    break  # too few free slots to be worth an admission while others still decode
                group: list[int] = [queue.popleft()]  # longest first: the group's width is its first prompt
                while (
                    queue
                    and len(group) < min(len(free), self.group_rows)
                    and (len(group) + 1) * len(prompts[group[0]]) <= self.prefill_tokens
                ):
                    group.append(queue.popleft())
                if self.pow2_groups:  # the rest goes back to the front of the queue: the next group
                    keep = 1 << (len(group).bit_length() - 1)
                    queue.extendleft(reversed(group[keep:]))
                    group = group[:keep]
                slots = [free.pop(0) for _ in group]
                tp = time.perf_counter()
                self._admit(slots, [prompts[i] for i in group], [limits[i] for i in group])
                sync_device(self.device)  # the prefill's own time, not charged to the next steps
                seconds = time.perf_counter() - tp
                stats.prefill_seconds += seconds
                stats.admissions.append((len(group), seconds))
                stats.prefill_tokens += sum(len(prompts[i]) for i in group)
                for s, i in zip(slots, group):
                    owner[s] = i
            for _ in range(self.sync_every):
                self._step()
            stats.steps += self.sync_every
            # the one synchronisation per `sync_every` steps; the finished answers then come over in one copy
            live, n_gen = torch.stack([self.live.long(), self.n_gen]).tolist()
            done = [s for s in range(self.slots) if owner[s] >= 0 and not live[s]]
            rows = self.out[done].tolist() if done else []
            for s, row in zip(done, rows):
                answer = row[: n_gen[s]]
                results[owner[s]] = answer
                stats.new_tokens += len(answer)
                bar.update(len(answer))
                owner[s] = -1
        bar.close()
        stats.seconds = time.perf_counter() - t0
        return results, stats
