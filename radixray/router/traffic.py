"""``Traffic``: this router's own requests on one worker, counted as they move.

The load a policy sees on a worker is two parts (``WorkerPool.states``):

* ours, exact and immediate: requests not yet past their first token (``waiting``, with their
  predicted uncached prefill tokens) and requests decoding (``running``, with their context);
* other routers': the worker's last report less what of ours it counted (``at_report``).

A poll in flight may see the worker at any moment until its reply: while one is open, the most of
our traffic it could have counted is kept (``poll_peaks``), so none of it is taken for another
router's when the reply lands (a request that lived and died inside a poll window is not phantom
load for a poll interval).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixray.protocol import TRAFFIC_FIELDS, LoadReport

__all__ = ["Traffic", "InFlight"]


@dataclass
class InFlight:
    uncached_tokens: int
    context_tokens: int
    started: bool = False


class Traffic:
    def __init__(self):
        self.requests: dict[str, InFlight] = {}
        self.now: dict[str, int] = dict.fromkeys(TRAFFIC_FIELDS, 0)  # in the report's terms
        self.at_report: dict[str, int] = {}  # ours as the last report counted it (its peak)
        self.poll_peaks: list[dict[str, int]] = []  # one per poll in flight

    def dispatch(self, request_id: str, uncached: int, context: int) -> None:
        self.requests[request_id] = InFlight(uncached, context)
        self._count(waiting=1, queued_prefill_tokens=uncached)

    def first_token(self, request_id: str) -> None:
        f = self.requests.get(request_id)
        if f is not None and not f.started:
            f.started = True
            self._count(
                waiting=-1,
                queued_prefill_tokens=-f.uncached_tokens,
                running=1,
                active_decode_tokens=f.context_tokens,
            )

    def tokens(self, request_id: str, n: int) -> None:
        """``n`` more tokens generated: the request's context on the worker grew by ``n``."""
        f = self.requests.get(request_id)
        if f is not None and n:
            f.context_tokens += n
            if f.started:  # once per streamed chunk: ``_count`` for the one field, inlined
                now = self.now
                v = now["active_decode_tokens"] = now["active_decode_tokens"] + n
                for peak in self.poll_peaks:
                    if v > peak["active_decode_tokens"]:
                        peak["active_decode_tokens"] = v

    def finish(self, request_id: str) -> None:
        f = self.requests.pop(request_id, None)
        if f is None:
            return
        if f.started:
            self._count(running=-1, active_decode_tokens=-f.context_tokens)
        else:
            self._count(waiting=-1, queued_prefill_tokens=-f.uncached_tokens)

    def _count(self, **delta: int) -> None:
        now = self.now
        for k, d in delta.items():
            now[k] += d
        for peak in self.poll_peaks:
            for k in delta:
                if now[k] > peak[k]:
                    peak[k] = now[k]

    def open_poll(self) -> dict[str, int]:
        peak = dict(self.now)
        self.poll_peaks.append(peak)
        return peak

    def close_poll(self, peak: dict[str, int], reported: bool) -> None:
        """The poll that opened ``peak`` ended; ``reported``: its report was taken (then what of
        ours it may have counted is ``peak``)."""
        # By identity: polls open at once (one asked for during a round) may hold equal dicts.
        self.poll_peaks = [p for p in self.poll_peaks if p is not peak]
        if reported:
            self.at_report = peak

    def load(self, report: LoadReport) -> tuple[int, int, int, int]:
        """(running, waiting, queued prefill tokens, active decode tokens): ours now plus the
        others' from ``report`` (per request and per worker: the four fields spelled out)."""
        now, at = self.now, self.at_report
        return (
            now["running"] + max(0, report.running - at.get("running", 0)),
            now["waiting"] + max(0, report.waiting - at.get("waiting", 0)),
            now["queued_prefill_tokens"]
            + max(0, report.queued_prefill_tokens - at.get("queued_prefill_tokens", 0)),
            now["active_decode_tokens"]
            + max(0, report.active_decode_tokens - at.get("active_decode_tokens", 0)),
        )
