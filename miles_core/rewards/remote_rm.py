"""remote_rm: the reward computed by an HTTP service.

Rule (REFERENCE §4): ``POST rm_url`` with the JSON body ``{prompt, response, label}``; the reply
body is JSON: a number (the reward, as float) or an object (a dict reward: pick a field with
``reward_key``). Each attempt is limited to ``rm_timeout`` seconds. Connection errors, timeouts,
HTTP 429 and 5xx are retried up to ``rm_max_retries`` more times, sleeping
``min(5, 0.2 * 2**(k-1))`` seconds before retry k; after the last one a
:class:`RemoteRewardError` names the url, the number of attempts and the last failure. Other
4xx replies, non-JSON bodies and JSON of another shape fail at once (retrying cannot fix them).
At most :data:`MAX_CONCURRENT_REQUESTS` requests per event loop are in flight.
Example: the service replies ``0.75`` -> 0.75; ``{"score": 1, "len": 3}`` -> that dict.
"""

from __future__ import annotations

import asyncio
import json
import math
import weakref
from typing import TYPE_CHECKING, Any

from miles_core.data.sample import Sample
from miles_core.rewards._text import as_text

if TYPE_CHECKING:
    from miles_core.rewards.options import RewardOptions

BACKOFF_BASE_S = 0.2
BACKOFF_CAP_S = 5.0
MAX_CONCURRENT_REQUESTS = 64
_limits: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = (
    weakref.WeakKeyDictionary())


class RemoteRewardError(RuntimeError):
    """The reward service could not produce a reward for a sample."""


def backoff_seconds(retry: int) -> float:
    """Sleep before retry ``retry`` (1-based)."""
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (retry - 1))


def parse_reward(url: str, body: str, sample: str = "") -> float | dict[str, Any]:
    """The reward in a reply body, or RemoteRewardError naming the url, the body and ``sample`` (which sample
    was scored). NaN and infinities are refused: a reward must be a finite number."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise RemoteRewardError(
            f"remote_rm {url} returned a non-JSON body ({exc}): {body[:200]!r}") from exc
    numbers = value.values() if isinstance(value, dict) else [value]
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        raise RemoteRewardError(f"remote_rm {url} returned {body[:200]!r} for {sample or 'a sample'}: a reward must be a finite number")
    if isinstance(value, dict):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise RemoteRewardError(
        f"remote_rm {url} returned JSON {type(value).__name__} {body[:200]!r}; "
        "expected a number or an object")


def _limit() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _limits:
        _limits[loop] = asyncio.Semaphore(MAX_CONCURRENT_REQUESTS)
    return _limits[loop]


async def remote_reward(sample: Sample, opts: "RewardOptions") -> float | dict[str, Any]:
    """POST the sample to ``opts.rm_url`` with timeouts and retries (see the module rule)."""
    import aiohttp

    url = opts.rm_url
    if not url:
        raise ValueError("rm_type remote_rm needs rm_url (the reward service URL)")
    payload = {"prompt": sample.prompt, "response": as_text(sample.response), "label": sample.label}
    attempts = opts.rm_max_retries + 1
    last_failure = "none"
    timeout = aiohttp.ClientTimeout(total=opts.rm_timeout)
    async with _limit(), aiohttp.ClientSession(timeout=timeout) as session:
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(backoff_seconds(attempt))
            try:
                async with session.post(url, json=payload) as reply:
                    status, body = reply.status, await reply.text()
            except TimeoutError:
                last_failure = f"timed out after {opts.rm_timeout}s"
                continue
            except aiohttp.ClientError as exc:
                last_failure = f"{type(exc).__name__}: {exc}"
                continue
            if status == 429 or status >= 500:
                last_failure = f"HTTP {status}: {body[:200]!r}"
                continue
            if status >= 400:
                raise RemoteRewardError(
                    f"remote_rm {url} rejected the request: HTTP {status}: {body[:200]!r}")
            return parse_reward(url, body, f"sample {sample.index} (group {sample.group_index}, rollout {sample.rollout_id})")
    raise RemoteRewardError(
        f"remote_rm {url} failed after {attempts} attempts; last failure: {last_failure}")
