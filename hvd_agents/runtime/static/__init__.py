"""The static runner: fixed-shape, graph-captured decode steps over a slot-addressed KV cache (GPU)."""

from hvd_agents.runtime.static.buckets import Buckets
from hvd_agents.runtime.static.decoder import StaticDecoder, supports
from hvd_agents.runtime.static.runner import StaticRunner
from hvd_agents.runtime.static.slot_kv import SlotKV, SlotPool, SlotsExhaustedError

__all__ = ["Buckets", "SlotKV", "SlotPool", "SlotsExhaustedError", "StaticDecoder", "StaticRunner", "supports"]
