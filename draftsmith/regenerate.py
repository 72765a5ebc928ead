"""Response regeneration by the target, served the way an inference engine serves a batch.

DFlash drafters learn the target's own answers, so the extraction job first replaces each last assistant turn with
what the target says. Transformers' `generate` decodes one fixed batch until its longest answer ends, grows its
cache by concatenation, and synchronises with the host every step. Here, inside Transformers and torch:

- a fixed number of *slots* decode together; each has a preallocated region of a key/value cache (attention layers)
  and its own Gated DeltaNet convolution and recurrent state (linear-attention layers), so a decode step has static
  shapes and writes in place;
- a slot whose answer ends is refilled with the next prompt at the next check (continuous batching): nobody waits
  for the longest answer;
- the step keeps its bookkeeping (positions, counts, stop flags, output tokens) on the device; the host looks every
  `sync_every` steps only to retire finished answers and admit new prompts;
- new prompts are prefilled together, left-padded (exact for both layer kinds: padded positions are masked in
  attention and zeroed before the convolution and the recurrence), and their caches copied into the free slots.

The model's own decoder layers run every step (no second implementation of the model): the slot cache answers the
calls they make on a Transformers cache (`update` for attention, the conv/recurrent state accessors for Gated
DeltaNet), and each slot attends to its own prefix through a per-row mask.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from . import decode_kernels
from .config import content_hash
from .data import write_parquet
from .store import write_json
from .taps import body, cache_kwarg, layer_types, names_sliding_layers, sliding_window
from .train import sync_device

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------ the slot cache


class _LinearSlots:
    """One Gated DeltaNet layer's per-slot states, under the names the layer reads from a Transformers cache."""

    record_past = False

    def __init__(self, conv: torch.Tensor, recurrent: torch.Tensor):
        self.conv_states = {0: conv}
        self.recurrent_states = {0: recurrent}


class _AttentionSlots:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values


class SlotCache:
    """Preallocated per-slot state for every layer; `pos[s]` is where slot s writes its next key/value."""

    def __init__(self, layer_types: list[str], slots: int, length: int, device: torch.device):
        self.layer_types = layer_types
        self.slots, self.length, self.device = slots, length, device
        self.layers: list = [None] * len(layer_types)
        self.pos = torch.zeros(slots, dtype=torch.long, device=device)
        self._rows = torch.arange(slots, device=device)
        self.static = False  # True under a CUDA graph: states must keep their addresses, so new ones are copied in

    # --- what the model's layers call during a decode step
    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        rows, pos = self._rows, self.pos
        if key.device != pos.device:  # a model split over a GPU group: this layer lives on another device
            rows, pos = rows.to(key.device), pos.to(key.device)
        layer.keys[rows, :, pos] = key[:, :, 0]
        layer.values[rows, :, pos] = value[:, :, 0]
        return layer.keys, layer.values

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return True

    def update_recurrent_state(self, state: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs):
        states = self.layers[layer_idx].recurrent_states
        if state is states[state_idx]:  # written in place (decode_kernels)
            return state
        if self.static:
            return states[state_idx].copy_(state)
        states[state_idx] = state  # the kernel's fresh output becomes the state: no extra read and write of it
        return state

    # newer Transformers (5.2x) read the states through accessors instead of `layers[i]`
    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor:
        return self.layers[layer_idx].conv_states[state_idx]

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor:
        return self.layers[layer_idx].recurrent_states[state_idx]

    def is_recording_past(self, layer_idx: int | None = None) -> bool:
        return False

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always passed explicitly

    # --- filling slots from a prefill
    def load(self, slot_ids: list[int], prefill_cache, lengths: list[int], width: int) -> None:
        """Copies a left-padded prefill's cache (rows = `slot_ids`, real lengths `lengths`) into those slots."""
        idx = torch.as_tensor(slot_ids, device=self.device)
        for i, kind in enumerate(self.layer_types):
            src = prefill_cache.layers[i]
            if kind == "linear_attention":
                conv, rec = src.conv_states[0], src.recurrent_states[0]
                if self.layers[i] is None:
                    self.layers[i] = _LinearSlots(conv.new_zeros((self.slots, *conv.shape[1:])),
                                                  rec.new_zeros((self.slots, *rec.shape[1:])))
                self.layers[i].conv_states[0][idx.to(conv.device)] = conv
                self.layers[i].recurrent_states[0][idx.to(rec.device)] = rec
            else:
                k, v = src.keys, src.values
                if self.layers[i] is None:
                    shape = (self.slots, k.shape[1], self.length, k.shape[3])
                    self.layers[i] = _AttentionSlots(k.new_zeros(shape), v.new_zeros(shape))
                kept = k.shape[2]  # the whole width, or a sliding layer's last window - 1 positions
                for row, (s, n) in enumerate(zip(slot_ids, lengths)):
                    m = min(n, kept)  # older positions stay as they are: outside the window, masked
                    self.layers[i].keys[s, :, n - m:n] = k[row, :, kept - m:]
                    self.layers[i].values[s, :, n - m:n] = v[row, :, kept - m:]

    def nbytes(self) -> int:
        total = 0
        for layer in self.layers:
            if isinstance(layer, _LinearSlots):
                total += layer.conv_states[0].nbytes + layer.recurrent_states[0].nbytes
            elif layer is not None:
                total += layer.keys.nbytes + layer.values.nbytes
        return total


# ------------------------------------------------------------------------------------------ decode attention


DECODE_ATTENTION = "draftsmith_decode"
_step_positions: dict[torch.device, torch.Tensor] = {}  # the running step's slot positions, per GPU (fused kernels)


def decode_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                     scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """One new token per slot against that slot's keys and values, query heads grouped by the head they share.

    With a per-row mask, Transformers' SDPA path first copies every key and value once per query head of its group
    (6x for Qwen3.6's 24/4 heads) and falls back to the math kernel: most of a decode step's memory traffic at large
    batch. Here each key and value is read once. Logit soft-capping (Gemma 2) and attention sinks (gpt-oss) are
    applied as those models' own eager attention applies them; several tokens go to SDPA.
    """
    mask_ok = isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool
    if query.shape[2] != 1 or not mask_ok or attention_mask.shape[2] != 1:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, hq, _, d = query.shape
    hkv = key.shape[1]
    scale = scaling if scaling is not None else d**-0.5
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    sinks = getattr(module, "sinks", None) if sinks is None else sinks
    pos = _step_positions.get(query.device)
    kernel_ok = query.is_cuda and d >= 16 and d & (d - 1) == 0 and key.stride(-1) == 1 and value.stride(-1) == 1
    if pos is not None and kernel_ok and softcap is None and sinks is None:
        # reads only the keys a slot has (within the window on sliding layers)
        return decode_kernels.attention_(query, key, value, pos, scale, kwargs.get("sliding_window") or 0), None
    q = query.reshape(b, hkv, hq // hkv, d)  # query head h reads key/value head h // group, as repeat_kv has it
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale  # [slots, kv heads, group, length]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~attention_mask, float("-inf"))
    if sinks is not None:  # one more logit per query head that takes probability mass and gives no value
        sink = sinks.float().reshape(1, hkv, hq // hkv, 1).expand(b, -1, -1, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs.to(value.dtype), value)  # [slots, kv heads, group, head dim]
    return out.reshape(b, 1, hq, d), None


def _attention_configs(model) -> list:
    """The config objects the attention layers read their implementation name from (one, or one per sub-model)."""
    from transformers import PretrainedConfig

    found = {id(m.config): m.config for m in model.modules()
             if isinstance(getattr(m, "config", None), PretrainedConfig)}
    return list(found.values())


# ------------------------------------------------------------------------------------------ sampling


def pick(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Greedy at temperature 0, else a sample from the temperature-scaled distribution cut to its top-p mass."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        sorted_p[(sorted_p.cumsum(-1) - sorted_p) > top_p] = 0.0  # keep the smallest prefix reaching top_p
        choice = torch.multinomial(sorted_p, 1, generator=generator)
        return order.gather(-1, choice)[:, 0]
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


# ------------------------------------------------------------------------------------------ the engine


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
        return (f"{self.prompts} answers, {self.new_tokens} new tokens in {self.seconds:.1f}s "
                f"({self.new_tokens_per_s:.0f} new tokens/s, {self.decode_tokens_per_s:.0f} while decoding; "
                f"{self.steps} decode steps, prefill "
                f"{self.prefill_tokens} tokens in {self.prefill_seconds:.1f}s)")

    def admission_summary(self) -> str:
        """Per group size: how many admissions, their seconds in all and the slowest (a first one of a size pays
        for compiling kernels specialised on it)."""
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
        ids[r, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
        att[r, width - len(p):] = 1
    return ids, att


def _cache_kinds(model) -> list[str]:
    """What each layer keeps in the slot cache: recurrent state (linear attention) or keys and values."""
    return ["linear_attention" if "linear" in t else "full_attention" for t in layer_types(model)]


class Engine:
    """Greedy or sampled decoding of many prompts through `slots` concurrent sequences of a Transformers model."""

    def __init__(self, model, slots: int, max_len: int, eos_ids: list[int], temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, sync_every: int = 8, prefill_tokens: int = 16384, pad_id: int = 0,
                 cuda_graph: bool = False, fused_kernels: bool = True, pow2_groups: bool = True):
        self.model = model
        self.device = next(model.parameters()).device
        self.types = _cache_kinds(model)
        # sliding-window layers keep every position in their slots (the prefill hands over only the last window)
        # and are masked to the window each step
        self.window = sliding_window(model)
        self.final_softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self.slots, self.max_len, self.sync_every, self.prefill_tokens = slots, max_len, sync_every, prefill_tokens
        self.group_rows = -(-slots // 4)  # prompts prefilled together: bounds the prefill's copy of their states
        # fla's prefill kernels are compiled and autotuned once per batch size (it is a constexpr there): refills
        # of 1, 2, 3, ... prompts would pay that (1 to 12 s on the 27B shape, one H200) for each new size, so groups
        # are cut to powers of two
        self.pow2_groups = pow2_groups
        self.temperature, self.top_p, self.pad_id = temperature, top_p, pad_id
        self.eos = torch.as_tensor(sorted(set(eos_ids)) or [-1], device=self.device)
        head = model.get_output_embeddings().weight.device  # where the logits are (the last GPU of a group)
        self.generator = torch.Generator(device=head).manual_seed(seed) if temperature > 0 else None
        self.cache = SlotCache(self.types, slots, max_len, self.device)
        d = self.device
        self.cur = torch.full((slots,), pad_id, dtype=torch.long, device=d)  # the token each slot feeds next
        self.n_gen = torch.zeros(slots, dtype=torch.long, device=d)
        self.limit = torch.zeros(slots, dtype=torch.long, device=d)  # new-token cap of each slot's answer
        self.live = torch.zeros(slots, dtype=torch.bool, device=d)
        self.out = torch.full((slots, max_len + 1), pad_id, dtype=torch.long, device=d)  # last column: scratch
        # one decode step replayed as a CUDA graph (greedy only: sampling would need the generator in the graph)
        devices = {p.device for p in model.parameters()}
        one_gpu = len(devices) == 1  # a graph is captured on one device
        self.cuda_graph = cuda_graph and self.device.type == "cuda" and temperature <= 0 and one_gpu
        self.graph: torch.cuda.CUDAGraph | None = None
        self.cache.static = self.cuda_graph
        self._cols = torch.arange(max_len, device=d)
        self._body = body(model)
        self._cache_kw = cache_kwarg(self._body)
        # hybrid models and those naming sliding layers take one mask per layer kind; the others one 4D mask (the
        # sliding one where a config gives a window and no layer kinds: then every layer slides)
        self._mask_by_kind = "linear_attention" in self.types or names_sliding_layers(model)
        from transformers import AttentionInterface

        AttentionInterface.register(DECODE_ATTENTION, decode_attention)
        self._configs = _attention_configs(model)
        # on a GPU the step's attention and Gated DeltaNet updates run on Triton kernels (decode_kernels)
        self.fused = fused_kernels and decode_kernels.available(self.device)
        self._mixer = decode_kernels.mixer_module(model) if self.fused else None
        # the slot positions the Triton attention reads, on every device of the model (refreshed in place each
        # step, so a captured graph keeps reading the same tensors)
        self._pos_copies = {dev: torch.empty_like(self.cache.pos, device=dev) for dev in devices - {self.device}}

    @torch.inference_mode()
    def _prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, object, int]:
        ids, att = left_pad(prompts, self.pad_id)
        pos = (att.cumsum(-1) - 1).clamp_min(0)
        out = self.model(input_ids=ids.to(self.device), attention_mask=att.to(self.device),
                         position_ids=pos.to(self.device), use_cache=True, logits_to_keep=1)
        cache = out.get("cache")  # Transformers 5.2x; reading `past_key_values` there warns that it is deprecated
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

        Runs before any prompt is admitted: a one-token dummy prefill creates the slot tensors, then warm-up and
        capture steps run with every slot dead. Admission later overwrites a slot's states, so nothing needs saving
        (a copy of the linear-attention states would cost as much memory as the states). Every tensor the step
        touches is allocated once, so replays stay valid.
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
        slide = mask & (self._cols[None, :] > (pos - self.window)[:, None])[:, None, None, :] if self.window else mask
        att = {"full_attention": mask, "sliding_attention": slide, "linear_attention": None} \
            if self._mask_by_kind else slide
        before = [c._attn_implementation_internal for c in self._configs]
        for c in self._configs:  # the step's attention reads each slot's keys once (see decode_attention)
            c._attn_implementation_internal = DECODE_ATTENTION
        if self.fused:  # the Triton attention reads each slot's keys up to its position, not the whole cache
            for copy in self._pos_copies.values():
                copy.copy_(pos)
            _step_positions.update({self.device: pos, **self._pos_copies})
        try:
            with decode_kernels.fused_decode(self._mixer):
                hidden = self._body(input_ids=self.cur[:, None], attention_mask=att, position_ids=pos[:, None],
                                    use_cache=True, **{self._cache_kw: self.cache}).last_hidden_state
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

    def run(self, prompts: list[list[int]], max_new_tokens: int | list[int], progress: bool = True
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
                group: list[int] = [queue.popleft()]  # longest first: the group's width is its first prompt
                while (queue and len(group) < min(len(free), self.group_rows)
                       and (len(group) + 1) * len(prompts[group[0]]) <= self.prefill_tokens):
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


# ------------------------------------------------------------------------------------------ the workflow's use


def fit_slots(wanted: int, max_len: int, per_position: int, fixed: int, free_bytes: int, reserve_bytes: int) -> int:
    """How many slots fit in `free_bytes` after `reserve_bytes` (prefill activations, logits, allocator slack).

    A slot holds `max_len` positions of keys and values plus its linear-attention states; the states count 1.25
    times, because a prefill group (at most a quarter of the slots, see `Engine.group_rows`) holds a copy of its
    rows' states until they are loaded into the slots.
    """
    return max(0, min(wanted, (free_bytes - reserve_bytes) // max(slot_need(per_position, fixed, max_len), 1)))


def slot_need(per_position: int, fixed: int, max_len: int) -> int:
    """Bytes one slot of `max_len` positions takes, its prefill copy of the states included (see `fit_slots`)."""
    return per_position * max_len + fixed + fixed // 4


def prefill_reserve(model, prefill_tokens: int) -> int:
    """Memory a prefill group's activations need: the widest of them (the MLP's) a few times over, plus 2 GiB."""
    cfg = model.config.get_text_config()
    width = getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size
    itemsize = next(model.parameters()).element_size()
    return 4 * prefill_tokens * width * itemsize + (2 << 30)


def eos_ids_of(model, tokenizer) -> list[int]:
    """Every id that ends an answer: the generation config's (often several, e.g. Llama 3's end-of-turn and
    end-of-text) and the tokenizer's. Regeneration and the benchmark stop on the same set."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for eos in (gen.eos_token_id if gen is not None else None, tokenizer.eos_token_id):
        ids += [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
    return sorted(set(ids))


class NoRoomForAnswers(RuntimeError):
    """Not even one answer's slot fits beside the weights: a setting must change, a retry cannot help."""


def plan_slots(model, wanted: int, max_len: int, pad_id: int, free_bytes: int, prefill_tokens: int = 16384) -> int:
    """The slots to decode with: `wanted`, or fewer (with a warning) when they do not fit in `free_bytes`."""
    per_position, fixed = Engine(model, slots=1, max_len=2, eos_ids=[], pad_id=pad_id).slot_bytes()
    reserve = prefill_reserve(model, prefill_tokens)
    fit = fit_slots(wanted, max_len, per_position, fixed, free_bytes, reserve)
    if fit < 1:
        need = (slot_need(per_position, fixed, max_len) + reserve) / 2**30
        raise NoRoomForAnswers(
            f"regeneration needs {need:.2f} GiB for one answer of up to {max_len} tokens, and {free_bytes / 2**30:.2f} "
            "GiB is free beside the weights: lower data.max_length or data.regenerate.max_new_tokens, or give the "
            "model more GPUs (a larger group)")
    if fit < wanted:
        log.warning("regeneration: %d slots of %d tokens do not fit in %.1f GiB free; using %d "
                    "(data.regenerate.batch_size)", wanted, max_len, free_bytes / 2**30, fit)
    return fit


def regenerate(model, tokenizer, samples: pd.DataFrame, max_new_tokens: int, temperature: float, max_length: int,
               slots: int, seed: int, top_p: float = 1.0, sync_every: int = 8, cuda_graph: bool = True
               ) -> tuple[pd.DataFrame, RegenStats]:
    """Replaces each last assistant turn with the target's own answer (drafters learn the target, not the data)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = [list(map(int, ids[:pl])) for ids, pl in zip(samples["input_ids"], samples["prompt_len"])]
    longest = max((len(p) for p in prompts), default=1)
    max_len = min(max_length, longest + max_new_tokens) + 1
    slots = max(1, min(slots, len(prompts)))
    device = next(model.parameters()).device
    if device.type == "cuda":  # slots are preallocated: size them to the memory left beside the weights
        torch.cuda.empty_cache()
        slots = plan_slots(model, slots, max_len, pad, torch.cuda.mem_get_info(device)[0])
    engine = Engine(model, slots=slots, max_len=max_len, eos_ids=eos_ids_of(model, tokenizer), temperature=temperature,
                    top_p=top_p, seed=seed, sync_every=sync_every, pad_id=pad, cuda_graph=cuda_graph)
    answers, stats = engine.run(prompts, max_new_tokens)
    log.info("regenerated %s; %s", stats.summary(), stats.admission_summary())
    new_ids, new_mask = [], []
    for k, (p, resp) in enumerate(zip(prompts, answers)):
        old_mask = np.asarray(samples["loss_mask"].iloc[k][: len(p)], dtype=np.uint8)
        new_ids.append(np.asarray(p + resp, dtype=np.int32)[:max_length])
        new_mask.append(np.concatenate([old_mask, np.ones(len(resp), dtype=np.uint8)])[:max_length])
    out = samples.copy()
    out["input_ids"] = new_ids
    out["loss_mask"] = new_mask
    out["num_tokens"] = [len(x) for x in new_ids]
    return out, stats


def cache_key(target: dict, regen: dict, max_length: int, samples: pd.DataFrame) -> str:
    """What the answers depend on: the target, the decoding settings and the prompts. Not the slot count or the
    sync interval, which change speed only, so a retry with fewer slots still reuses them."""
    decoding = {k: v for k, v in regen.items() if k not in ("batch_size", "sync_every", "cuda_graph")}
    prompts = [np.asarray(ids[:pl]).tobytes().hex() for ids, pl in zip(samples["input_ids"], samples["prompt_len"])]
    return content_hash(target, decoding, max_length, samples["id"].tolist(), prompts)


def regenerate_cached(model, tokenizer, samples: pd.DataFrame, cache: Path, key: str, **kwargs
                      ) -> tuple[pd.DataFrame, RegenStats | None]:
    """`regenerate`, with the answers kept in `cache` (a parquet file and its key beside it): a rerun of the job
    (a retry after running out of memory in extraction, a killed job, new taps or storage) reuses them instead of
    decoding for hours again. Stats are None when the answers were reused."""
    stamp = cache.with_suffix(".json")
    try:
        if json.loads(stamp.read_text()).get("key") == key:
            done = pd.read_parquet(cache)
            if done["id"].tolist() == samples["id"].tolist():
                log.info("regeneration: reusing %d answers from %s (same target, settings and prompts)", len(done),
                         cache)
                return done, None
    except (OSError, ValueError, KeyError):
        pass  # no cache, or a torn one: decode
    out, stats = regenerate(model, tokenizer, samples, **kwargs)
    write_parquet(out, cache)
    write_json(stamp, {"key": key, "answers": len(out)})
    return out, stats


# ------------------------------------------------------------------------------------------ benchmark


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int = 0) -> tuple[list[list[int]], float]:
    """Transformers' greedy `generate` on one left-padded batch (no EOS): answers and seconds."""
    device = next(model.parameters()).device
    ids, att = left_pad(prompts, pad_id)
    sync_device(device)
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids.to(device), attention_mask=att.to(device), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=pad_id)
    sync_device(device)
    return out[:, ids.shape[1]:].tolist(), time.perf_counter() - t0


def answer_lengths(n: int, longest: int, spread: bool, seed: int = 0) -> list[int]:
    """Every answer `longest` tokens, or (spread) lengths drawn uniformly from longest/8 to longest: a random-weight
    target never says EOS, so this stands in for answers that end at different times."""
    if not spread:
        return [longest] * n
    g = torch.Generator().manual_seed(seed)
    return torch.randint(max(1, longest // 8), longest + 1, (n,), generator=g).tolist()


def admit_times(model, vocab: int, prompt_len: int, sizes: list[int], seed: int = 0, log=print) -> list[dict]:
    """Seconds to admit (prefill and load into slots) a group of each size of `prompt_len`-token prompts, the first
    time and again: the first includes compiling and autotuning whatever kernels are specialised on that size."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, vocab, (prompt_len,), generator=g).tolist() for _ in range(max(sizes))]
    engine = Engine(model, slots=max(sizes), max_len=prompt_len + 2, eos_ids=[])
    rows = []
    for size in sizes:
        times = []
        for _ in range(2):
            sync_device(device)
            t0 = time.perf_counter()
            engine._admit(list(range(size)), prompts[:size], [1] * size)
            sync_device(device)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        engine._prefill(prompts[:size])
        sync_device(device)
        rows.append({"group": size, "first_s": times[0], "again_s": times[1], "prefill_s": time.perf_counter() - t0,
                     "tokens_per_s": size * prompt_len / times[1]})
        log(f"admit {size:3d} prompts of {prompt_len}: first {times[0]:.2f}s, again {times[1]:.3f}s (prefill alone "
            f"{rows[-1]['prefill_s']:.3f}s, {rows[-1]['tokens_per_s']:.0f} prompt tok/s)")
    return rows


def _timed_engine(model, prompts: list[list[int]], slots: int, new_tokens: int | list[int], max_len: int,
                  graph: bool, fused: bool = True, pow2_groups: bool = True
                  ) -> tuple[Engine, list[list[int]], RegenStats]:
    """One engine run after a one-prompt warm-up (kernels, autotuning, allocator, graph capture)."""
    device = next(model.parameters()).device
    engine = Engine(model, slots=slots, max_len=max_len, eos_ids=[], sync_every=8, cuda_graph=graph,
                    fused_kernels=fused, pow2_groups=pow2_groups)
    engine.run(prompts[:1], 8, progress=False)  # every step runs all slots, so this warms the full batch
    sync_device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    answers, stats = engine.run(prompts, new_tokens, progress=False)
    sync_device(device)
    return engine, answers, stats


def same_prompts(model, prompts: list[list[int]], batch: int, lengths: list[int], graph: bool, log=print,
                 pow2_groups: bool = True) -> dict:
    """`generate` and the engine on the same prompts and answer lengths at the same batch size.

    `generate` takes the prompts `batch` at a time and runs each batch until its longest answer is done (what it
    does with EOS on: finished rows keep decoding padding); only the `lengths` count as new tokens. The engine gets
    them all through `batch` slots. Decode-only rates subtract each side's prefill (`generate`: a one-token run of
    the same batch).
    """
    device = next(model.parameters()).device
    row: dict = {"batch": batch, "prompts": len(prompts), "longest": max(lengths), "new_tokens": sum(lengths)}
    try:
        hf_generate(model, prompts[:batch], 2)  # warm-up
        gen_s = gen_prefill_s = 0.0
        for i in range(0, len(prompts), batch):
            group = prompts[i: i + batch]
            gen_prefill_s += hf_generate(model, group, 1)[1]
            gen_s += hf_generate(model, group, max(lengths[i: i + batch]))[1]
    except torch.OutOfMemoryError as e:
        row["generate_error"] = f"OutOfMemoryError: {str(e).splitlines()[0]}"
        log(f"same prompts, batch {batch}: generate ran out of memory")
        return row
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    steps = sum(max(lengths[i: i + batch]) - 1 for i in range(0, len(prompts), batch))
    row.update(generate_seconds=gen_s, generate_tokens_per_s=row["new_tokens"] / gen_s,
               generate_step_ms=1e3 * (gen_s - gen_prefill_s) / max(steps, 1),
               generate_decode_tokens_per_s=(row["new_tokens"] - len(prompts)) / max(gen_s - gen_prefill_s, 1e-9))
    log(f"same prompts, batch {batch}: generate {row['generate_tokens_per_s']:.0f} new tok/s end to end "
        f"({gen_s:.1f}s, {row['generate_step_ms']:.0f} ms a step), {row['generate_decode_tokens_per_s']:.0f} "
        "decoding")
    engine, _, stats = _timed_engine(model, prompts, batch, lengths, len(prompts[0]) + max(lengths) + 1, graph,
                                     pow2_groups=pow2_groups)
    row.update(cuda_graph=engine.cuda_graph, pow2_groups=pow2_groups, engine_seconds=stats.seconds,
               engine_prefill_seconds=stats.prefill_seconds, engine_tokens_per_s=stats.new_tokens_per_s,
               engine_decode_tokens_per_s=stats.decode_tokens_per_s,
               ratio=stats.new_tokens_per_s / row["generate_tokens_per_s"],
               decode_ratio=stats.decode_tokens_per_s / row["generate_decode_tokens_per_s"])
    log(f"same {len(prompts)} prompts at batch {batch}, answers of {min(lengths)}-{max(lengths)} tokens "
        f"({row['new_tokens']} in all), prefill included: generate {row['generate_tokens_per_s']:.0f} new tok/s "
        f"({gen_s:.1f}s, {row['generate_step_ms']:.0f} ms a step), engine {row['engine_tokens_per_s']:.0f} "
        f"({stats.seconds:.1f}s, {stats.prefill_seconds:.1f}s of it prefill, graph {row['cuda_graph']}, groups of "
        f"powers of two {pow2_groups}): {row['ratio']:.1f}x; decoding alone: generate "
        f"{row['generate_decode_tokens_per_s']:.0f}, engine {row['engine_decode_tokens_per_s']:.0f}: "
        f"{row['decode_ratio']:.1f}x")
    log(f"engine, {stats.admission_summary()}")
    # the same prompts again on the same engine: what a long job sees once every kernel is compiled and tuned
    sync_device(device)
    again = engine.run(prompts, lengths, progress=False)[1]
    row.update(engine_again_seconds=again.seconds, engine_again_prefill_seconds=again.prefill_seconds,
               engine_again_tokens_per_s=again.new_tokens_per_s,
               ratio_again=again.new_tokens_per_s / row["generate_tokens_per_s"])
    log(f"engine again on the same prompts: {again.new_tokens_per_s:.0f} new tok/s ({again.seconds:.1f}s, "
        f"{again.prefill_seconds:.1f}s of it prefill): {row['ratio_again']:.1f}x generate; {again.admission_summary()}")
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def profile_steps(model, vocab: int, slots: int, prompt_len: int, steps: int = 4, rows: int = 15, new_tokens: int = 64,
                  fused: bool = True) -> str:
    """The top kernels of `steps` eager decode steps with every slot live: where a step's time goes (each slot's
    cache holds room for `new_tokens` answers)."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, vocab, (prompt_len,), generator=g).tolist() for _ in range(slots)]
    engine = Engine(model, slots=slots, max_len=prompt_len + new_tokens + 1, eos_ids=[], fused_kernels=fused)
    engine.run(prompts[:1], 4, progress=False)  # warm-up
    engine._admit(list(range(slots)), prompts, [new_tokens] * slots)
    for _ in range(2):
        engine._step()
    sync_device(engine.device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine._step()
        sync_device(engine.device)
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60)


def bench(model, vocab: int, batch_sizes: list[int], prompt_len: int, new_tokens: int, waves: int,
          generate_batches: list[int], generate_new_tokens: int, check_prompts: int, check_tokens: int,
          graphs: tuple[bool, ...] = (False,), generate_waves: int = 1, spread: bool = False,
          unfused_batches: tuple[int, ...] = (), eager_batches: tuple[int, ...] | None = None, seed: int = 0,
          pow2_groups: bool = True, spread_engine: bool = False, again: bool = False, log=print) -> dict:
    """New tokens/s of the engine at each slot count (prompts = slots x waves, answers of fixed length: EOS off),
    end to end (prefill included) and for the decode loop alone, eager (only at `eager_batches` if given) and as a
    CUDA graph if `graphs` says so; at `unfused_batches` also without the Triton decode kernels (their A/B); then
    `generate` and the engine on the very same prompts and answer lengths at the `generate_batches` sizes (see
    same_prompts). `spread_engine` gives the engine rows answer lengths from 1/8 to all of `new_tokens`, and
    `again` reruns each of them on the warm engine. Plus a greedy agreement check of the first `check_tokens`
    tokens against `generate` at batch 1."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    top = max([b * waves for b in batch_sizes] + [b * generate_waves for b in generate_batches] + [check_prompts])
    prompts = [torch.randint(1, vocab, (prompt_len,), generator=g).tolist() for _ in range(top)]
    result: dict = {"prompt_len": prompt_len, "new_tokens": new_tokens, "waves": waves, "engine": []}
    if decode_kernels.available(device):
        result["kernel_check"] = decode_kernels.self_check(device)
        log(f"in-place decode kernels against the functions they replace, largest differences: "
            f"{ {k: f'{v:.2e}' for k, v in result['kernel_check'].items()} }")

    agree, margins, typical = [], [], []
    for p in prompts[:check_prompts]:
        ids = torch.as_tensor([p], device=device)
        ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=check_tokens,
                             min_new_tokens=check_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
        want = ref.sequences[0, len(p):].tolist()
        top2 = torch.stack([x[0].float().topk(2).values for x in ref.scores])  # generate's own logits per step
        gap = (top2[:, 0] - top2[:, 1]).tolist()
        got, _ = Engine(model, slots=1, max_len=prompt_len + check_tokens + 1, eos_ids=[]).run([p], check_tokens,
                                                                                            progress=False)
        same = next((i for i, (a, b) in enumerate(zip(want, got[0])) if a != b), len(got[0]))
        agree.append(same)
        margins.append(gap[same] if same < len(gap) else None)
        typical.append(float(np.median(gap)))
    result["greedy_agreement"] = agree
    result["greedy_margin_at_difference"] = margins
    result["greedy_median_margin"] = typical
    log(f"greedy check, first {check_tokens} tokens vs generate at batch 1: tokens equal before the first "
        f"difference per prompt {agree}; generate's top-1 minus top-2 logit there "
        f"{[None if m is None else round(m, 4) for m in margins]} (median over its steps "
        f"{[round(m, 4) for m in typical]}: a difference at a near-tie is rounding, not a bug)")

    graph_ok = True
    if device.type != "cuda":  # CUDA graphs need a GPU: every batch runs eagerly
        graphs, eager_batches = (False,), None
    for b in batch_sizes:
        eager_answers = None
        variants = [(graph, True) for graph in graphs if graph or eager_batches is None or b in eager_batches]
        variants += [(graph, False) for graph in graphs if b in unfused_batches]
        for graph, fused in variants:
            if graph and not graph_ok:
                continue
            try:
                lengths = answer_lengths(b * waves, new_tokens, spread_engine, seed)
                engine, answers, stats = _timed_engine(model, prompts[: b * waves], b, lengths,
                                                       prompt_len + new_tokens + 1, graph, fused, pow2_groups)
            except Exception as e:  # noqa: BLE001 - a failed variant is a figure too; the others still run
                log(f"engine  batch {b:4d} graph {graph}: FAILED {type(e).__name__}: {e}")
                result["engine"].append({"batch": b, "cuda_graph": graph, "error": f"{type(e).__name__}: {e}"})
                graph_ok = graph_ok and not graph
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            graph, fused = engine.cuda_graph, engine.fused  # off where there is no GPU
            row = {"batch": b, "cuda_graph": graph, "fused_kernels": fused,
                   "new_tokens_per_s": stats.new_tokens_per_s,
                   "decode_tokens_per_s": stats.decode_tokens_per_s, "seconds": stats.seconds,
                   "prefill_seconds": stats.prefill_seconds, "steps": stats.steps,
                   "step_ms": 1e3 * (stats.seconds - stats.prefill_seconds) / max(stats.steps, 1),
                   "cache_gb": engine.cache.nbytes() / 1e9,
                   "peak_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None,
                   "first_answer_head": answers[0][:8]}
            if eager_answers is None:
                eager_answers = answers
            else:  # graph and kernel variants must decode what the first variant decoded
                row["answers_equal_first"] = sum(a == e for a, e in zip(answers, eager_answers)) / len(answers)
            result["engine"].append(row)
            log(f"engine  batch {b:4d} graph {graph!s:5} fused {fused!s:5}: {row['new_tokens_per_s']:7.0f} new tok/s "
                f"end to end, {row['decode_tokens_per_s']:7.0f} decoding ({stats.steps} steps of "
                f"{row['step_ms']:.1f} ms, prefill {stats.prefill_seconds:.1f}s of {stats.seconds:.1f}s, cache "
                f"{row['cache_gb']:.1f} GB, peak {row['peak_gb'] or 0:.1f} GB, first answer starts "
                f"{row['first_answer_head']}"
                + (f", answers equal to the first variant's: {row['answers_equal_first']:.0%})"
                   if "answers_equal_first" in row else ")"))
            if again:  # the same prompts on the warm engine: kernels for every group size compiled and tuned
                sync_device(device)
                warm = engine.run(prompts[: b * waves], lengths, progress=False)[1]
                row.update(again_new_tokens_per_s=warm.new_tokens_per_s, again_seconds=warm.seconds,
                           again_prefill_seconds=warm.prefill_seconds)
                log(f"engine  batch {b:4d} again: {warm.new_tokens_per_s:7.0f} new tok/s end to end, "
                    f"{warm.decode_tokens_per_s:7.0f} decoding (prefill {warm.prefill_seconds:.1f}s of "
                    f"{warm.seconds:.1f}s); first run's {stats.admission_summary()}")
            del engine
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the next slot cache is larger; a freed graph pool must not fragment it
    ok = [r for r in result["engine"] if "error" not in r]
    best = result["best"] = max(ok, key=lambda r: r["new_tokens_per_s"]) if ok else None
    if best:
        log(f"best: {best['new_tokens_per_s']:.0f} new tok/s end to end ({best['decode_tokens_per_s']:.0f} decoding) "
            f"at batch {best['batch']} (graph {best['cuda_graph']}, fused kernels {best['fused_kernels']})")
    result["same_prompts"] = []
    for b in generate_batches:
        n = b * generate_waves
        lengths = answer_lengths(n, generate_new_tokens, spread, seed)
        result["same_prompts"].append(same_prompts(model, prompts[:n], b, lengths, graphs[-1] and graph_ok, log,
                                                   pow2_groups))
    return result
