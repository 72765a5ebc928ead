"""The slot cache: per-slot key/value and Gated DeltaNet states that the engine's batched decode reads."""

from __future__ import annotations

import torch


class _LinearSlots:
    """One Gated DeltaNet layer's per-slot states, under the names the layer reads from a Transformers
    cache."""

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
        self.static = (
            False  # True under a CUDA graph: states must keep their addresses, so new ones are copied in
        )

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
        if state is states[state_idx]:  # written in place (engine.kernels)
            return state
        if self.static:
            return states[state_idx].copy_(state)
        states[state_idx] = (
            state  # the kernel's fresh output becomes the state: no extra read and write of it
        )
        return state

    # newer Transformers (5.2x) read the states through accessors instead of `layers[i]`
    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor:
        return self.layers[layer_idx].conv_states[state_idx]

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor:
        return self.layers[layer_idx].recurrent_states[state_idx]

    def is_recording_past(self, layer_idx: int | None = None) -> bool:
        return False

    def increase_count(self, layer_idx: int, state_idx: int = 0) -> None:
        """Transformers 5.25 counts decoded tokens on the cache when the convolution updates its state in
        place; a slot's position lives in `pos`, so there is nothing to count."""

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always passed explicitly

    # --- filling slots from a prefill
    def load(self, slot_ids: list[int], prefill_cache, lengths: list[int], width: int) -> None:
        """Copies a left-padded prefill's cache (rows = `slot_ids`, real lengths `lengths`) into those
        slots."""
        idx = torch.as_tensor(slot_ids, device=self.device)
        where: dict = {}  # per (device, kept width): which prefill positions go to which slot position
        for i, kind in enumerate(self.layer_types):
            src = prefill_cache.layers[i]
            if kind == "linear_attention":
                conv, rec = src.conv_states[0], src.recurrent_states[0]
                if self.layers[i] is None:
                    self.layers[i] = _LinearSlots(
                        conv.new_zeros((self.slots, *conv.shape[1:])),
                        rec.new_zeros((self.slots, *rec.shape[1:])),
                    )
                self.layers[i].conv_states[0][idx.to(conv.device)] = conv
                self.layers[i].recurrent_states[0][idx.to(rec.device)] = rec
            else:
                k, v = src.keys, src.values
                if self.layers[i] is None:
                    shape = (self.slots, k.shape[1], self.length, k.shape[3])
                    self.layers[i] = _AttentionSlots(k.new_zeros(shape), v.new_zeros(shape))
                kept = k.shape[2]  # the whole width, or a sliding layer's last window - 1 positions
                if (k.device, kept) not in where:
                    where[(k.device, kept)] = [t.to(k.device) for t in _handover(slot_ids, lengths, kept)]
                rows, cols, slots, pos = where[(k.device, kept)]
                # one scatter a layer: row r's last min(n_r, kept) kept positions end at its length n_r (older
                # positions stay as they are: outside the window, masked)
                self.layers[i].keys[slots, :, pos] = k[rows, :, cols]
                self.layers[i].values[slots, :, pos] = v[rows, :, cols]

    def nbytes(self) -> int:
        total = 0
        for layer in self.layers:
            if isinstance(layer, _LinearSlots):
                total += layer.conv_states[0].nbytes + layer.recurrent_states[0].nbytes
            elif layer is not None:
                total += layer.keys.nbytes + layer.values.nbytes
        return total


def _handover(slot_ids: list[int], lengths: list[int], kept: int) -> tuple[torch.Tensor, ...]:
    """Index tensors for a left-padded prefill's keys [rows, heads, kept, dim]: the (row, position) pairs that
    hold real tokens among the last min(length, kept), and the (slot, position) each goes to. Built on the
    host from the host's lists, so that nothing waits for the GPU."""
    n = torch.as_tensor(lengths)
    p = torch.arange(kept)
    real = p[None, :] >= (kept - torch.clamp(n, max=kept))[:, None]  # [rows, kept]
    rows, cols = real.nonzero(as_tuple=True)
    return rows, cols, torch.as_tensor(slot_ids)[rows], n[rows] - kept + cols
