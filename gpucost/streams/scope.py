"""What one input message may speak for, checked on each decoded event by both paths.

On Kafka a message is keyed by one GPU (or one process, for ``mem_access``) and signed by one
node's key. Without these checks a message keyed for GPU A could carry events of GPU B and
bill B twice, a node's key could sign samples of another node's GPUs, and any node could
sign a ``price`` that zeroes or inflates every bill. The checks run on the events as the
pipeline decoded them, never on a second parse of the text, so no line can read one way to
the check and another way to the operators (two JSON parsers disagree on edge cases).

Prices carry their own signature, by a price authority's key, so that node producers may
relay them into their GPUs' streams without being able to forge them. The embedded run has
one trust domain and no scope.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpucost.schemas.codec import Rejected, decode_line
from gpucost.schemas.events import ON_GPU_KEY, Event, MemAccess, Price, TenantBinding

__all__ = ["PRICE_SCOPE", "Scope", "claimed_node", "decode_in_scope", "price_mac"]

#: the entry of a key's node list that lets it sign prices (``*`` lets it too)
PRICE_SCOPE = "@prices"


def price_mac(secret: bytes, price: Price) -> str:
    """The hex HMAC-SHA256 of a price's model, time and exact rate (six decimals), with ``secret``."""
    text = f"price\x1f{price.gpu_model}\x1f{price.ts_ns}\x1f{price.usd_per_gpu_hour:.6f}"
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Scope:
    """``key``: the message's key (a GPU, or ``node_id/pid``); ``nodes``: the nodes its signer may
    speak for (None: any); ``price_keys``: key id → secret of the keys that may sign prices
    (None: prices need no signature). A price is taken when it carries a valid signature by one of
    those keys, or carries none and the message's signer is one of them."""

    key: str | None = None
    nodes: frozenset[str] | None = None
    price_keys: Mapping[str, bytes] | None = None
    #: the message's own signer may sign prices (``*`` or ``@prices``): it vouches for the unsigned
    #: prices it carries, as a single-key deployment's producer does
    signer_sets_prices: bool = False

    def check(self, event: Event) -> Rejected | None:
        """Why ``event`` may not travel in this message, or None."""
        if self.key is not None:
            if isinstance(event, ON_GPU_KEY) and event.gpu_uuid != self.key:
                return Rejected(
                    "wrong_key",
                    f"a {event.kind} of GPU {event.gpu_uuid[:256]!r} in a message keyed "
                    f"{self.key[:256]!r}: a message carries only its own GPU's events",
                    event.kind,
                )
            if isinstance(event, MemAccess) and f"{event.node_id}/{event.pid}" != self.key:
                return Rejected(
                    "wrong_key",
                    f"a mem_access of {event.node_id[:256]!r}/{event.pid} in a message keyed {self.key[:256]!r}",
                    event.kind,
                )
        node = getattr(event, "node_id", None)
        if self.nodes is not None and node is not None and node not in self.nodes:
            return Rejected("bad_signature", f"the message's key may not speak for node {node[:256]!r}", event.kind)
        if isinstance(event, Price) and self.price_keys is not None:
            return self._price(event)
        return None

    def refused_many(
        self,
        gpu_keyed: np.ndarray,
        mem: np.ndarray,
        gpu: np.ndarray,
        gpu_names: list[str],
        node: np.ndarray,
        node_names: list[str],
        pid: np.ndarray,
    ) -> np.ndarray:
        """``check``'s key and node rules over a batch's columns, beside it so that the two cannot drift:
        which rows are refused (their reason is ``check``'s of each). ``gpu_keyed`` and ``mem`` mark the rows
        of GPU-keyed kinds and of ``mem_access``; ``gpu`` and ``node`` index ``gpu_names`` and
        ``node_names``, one past the end for none; ``pid`` each row's process."""
        wrong = np.zeros(len(gpu), bool)
        if self.key is not None:
            gpu_is_key = np.array([name == self.key for name in gpu_names] + [False])[gpu]
            wrong |= gpu_keyed & ~gpu_is_key
            node_of_key, _, pid_of_key = self.key.rpartition("/")
            node_is = np.array([name == node_of_key for name in node_names] + [False])[node]
            pid_is = pid == (int(pid_of_key) if pid_of_key.isdigit() and len(pid_of_key) <= 10 else -2)
            wrong |= mem & ~(node_is & pid_is)
        if self.nodes is not None:
            wrong |= ~np.array([name in self.nodes for name in node_names] + [False])[node]
        return wrong

    def _price(self, price: Price) -> Rejected | None:
        assert self.price_keys is not None
        if self.signer_sets_prices and price.key_id is None and price.signature is None:
            return None
        if price.key_id is None or price.signature is None:
            return Rejected(
                "unsigned",
                f"a price of {price.gpu_model[:256]!r} without the price authority's "
                "signature; sign price files with `gpucost prices sign`",
                price.kind,
            )
        secret = self.price_keys.get(price.key_id)
        if secret is None:
            return Rejected(
                "unknown_key",
                f"price key {price.key_id[:64]!r} is not in the keyring, or may not "
                f"sign prices (its nodes must include {PRICE_SCOPE} or be *)",
                price.kind,
            )
        if not hmac.compare_digest(price_mac(secret, price), price.signature):
            return Rejected(
                "bad_signature",
                f"the signature of the price of {price.gpu_model[:256]!r} at {price.ts_ns} does not match it",
                price.kind,
            )
        return None


def decode_in_scope(line: str | bytes | dict[str, Any], scope: Scope | None) -> Event | Rejected:
    """``decode_line``, then, for a valid event, ``scope``'s check: the one decode both paths make of a
    line they take one by one."""
    event = decode_line(line)
    if isinstance(event, Rejected) or scope is None:
        return event
    return scope.check(event) or event


def claimed_node(key: str, node: str, lines: Iterable[bytes | dict[str, Any]]) -> bool:
    """Whether a message keyed ``key``, signed by a key limited to ``node``, makes ``node`` the key's owner: it
    does only if one of its events names that node and is of that key (a GPU-keyed event of the GPU, an address
    of the process) or is a binding of that node (the router sends a node's bindings on its GPUs' keys, often
    before their first sample). A message that names no node, a price alone, or another key's events
    establishes nothing: the first key to sign any message of a GPU once took it, and refused its own node's
    events as ``wrong_key``. ``lines`` are JSON lines or wire objects (an Arrow message's rows)."""
    for line in lines:
        event = decode_line(line)
        if getattr(event, "node_id", None) != node:
            continue
        if isinstance(event, ON_GPU_KEY) and event.gpu_uuid == key:
            return True
        if isinstance(event, MemAccess) and f"{event.node_id}/{event.pid}" == key:
            return True
        if isinstance(event, TenantBinding) and "/" not in key:
            return True
    return False
