"""The heartbeat a region's LB sends to the registry: the typed message (:class:`Heartbeat`, its fields and
their bounds) and its one builder, :func:`heartbeat_message`.

Built here for both drivers -- the Serve ingress (``serve/ingress/peers.py``: ``PeerMesh.heartbeat``, sent
by ``RegistryClient``) and the simulator's LB (``sim/region_lb.py``) -- and read by the registry
(``RegistryState.heartbeat_batch``) with the same model, so both ends agree on every field. On the wire a
heartbeat stays a plain JSON-able dict (it crosses Ray actor calls): the builder returns the validated
model's :meth:`Heartbeat.wire`, and the registry validates each item it receives.

A refusal names the field and the bound (:func:`first_error`): ``heartbeat.extra['inflight']: must be a
finite number in [0, 1e+15], got -3``; a bad region or source name is ``bad_name`` and a region the
registry does not serve ``unknown_region`` (the registry's ``HeartbeatRefused`` codes), anything else
``malformed``. Bad values are shown short (a name cut to 40 characters, a huge integer by its size).
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, Mapping, Optional, Tuple, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic.functional_validators import BeforeValidator
from pydantic_core import PydanticCustomError

from ray_geolb.policy.region.config import REGION_PATTERN

__all__ = ["Heartbeat", "HeartbeatExtra", "MAX_COUNT", "MAX_DELAY_S", "MAX_EXTRA_KEYS", "MAX_EXTRA_KEY_LEN",
           "MAX_NUMBER", "MAX_REGION_NAME", "MAX_SOURCE_NAME", "first_error", "heartbeat_message",
           "validate_extra"]

#: name bounds: a region is 1-64 characters of REGION_PATTERN's alphabet (no "/"); a source (an ingress
#: replica, ``<region>/<replica id>``) 1-128 of the same plus "/"
MAX_REGION_NAME = 64
MAX_SOURCE_NAME = 128
SOURCE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"
#: the largest count a heartbeat may state (available replicas, queue length) and the largest other number
MAX_COUNT = 1_000_000_000
MAX_NUMBER = 1e15
#: heartbeat ``extra`` limits: keys per region, key length
MAX_EXTRA_KEYS = 16
MAX_EXTRA_KEY_LEN = 64
EXTRA_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:-]*$"
#: the largest one-way delay a heartbeat may declare (``delay_s``): a registry call times out long before
MAX_DELAY_S = 10.0


def show(x, n: int = 40) -> str:
    """A name as an error line may quote it: its first ``n`` characters, and its length when longer."""
    if isinstance(x, str):
        return repr(x[:n]) + (f"... ({len(x)} characters)" if len(x) > n else "")
    return type(x).__name__


def show_num(x) -> str:
    """A bad number as an error line quotes it (a huge integer by its size, a string cut)."""
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 10**30:
        return f"an integer of {x.bit_length()} bits"
    if isinstance(x, (bool, int, float)) or x is None:
        return repr(x)
    return show(x)


def worded(code: str, wording: str, shown=show) -> WrapValidator:
    """A type's refusal in one wording (``"<wording>, got <the value, shown short>"``) whatever pydantic's
    reason, typed ``code`` (the error's ``type``: a registry refusal code, or ``malformed``)."""
    def check(v, handler):
        try:
            return handler(v)
        except ValidationError:
            raise PydanticCustomError(code, wording + ", got {got}", {"got": shown(v)}) from None
    return WrapValidator(check)


def _strict(**kw):
    return Field(strict=True, **kw)


#: a region name (the registry refuses a bad one as ``bad_name``)
RegionName = Annotated[str, _strict(min_length=1, max_length=MAX_REGION_NAME, pattern=REGION_PATTERN),
                       worded("bad_name", f"must be 1-{MAX_REGION_NAME} characters of letters, digits, "
                                          f"_ . : - (starting with a letter or digit)")]
#: a source name (an ingress replica, ``<region>/<replica id>``)
SourceName = Annotated[str, _strict(min_length=1, max_length=MAX_SOURCE_NAME, pattern=SOURCE_PATTERN),
                       worded("bad_name", f"must be 1-{MAX_SOURCE_NAME} characters of letters, digits, "
                                          f"_ . : / - (starting with a letter or digit)")]
#: a count: an integer in [0, MAX_COUNT]
Count = Annotated[int, _strict(ge=0, le=MAX_COUNT),
                  worded("malformed", f"must be an integer in [0, {MAX_COUNT}]", show_num)]
#: a finite number in [0, MAX_NUMBER], kept an int when it is one (a larger int might not even convert to a
#: float: refused, not raised)
Number = Annotated[Union[Annotated[int, _strict(ge=0, le=MAX_NUMBER)],
                         Annotated[float, _strict(ge=0, le=MAX_NUMBER, allow_inf_nan=False)]],
                   worded("malformed", f"must be a finite number in [0, {MAX_NUMBER:g}]", show_num)]
#: a declared one-way delay to the registry: a finite number of seconds in [0, MAX_DELAY_S]
Delay = Annotated[Union[Annotated[int, _strict(ge=0, le=MAX_DELAY_S)],
                        Annotated[float, _strict(ge=0, le=MAX_DELAY_S, allow_inf_nan=False)]],
                  worded("malformed", f"must be a finite number of seconds in [0, {MAX_DELAY_S:g}]", show_num)]
ExtraKey = Annotated[str, _strict(min_length=1, max_length=MAX_EXTRA_KEY_LEN, pattern=EXTRA_KEY_PATTERN),
                     worded("malformed", f"field names must be 1-{MAX_EXTRA_KEY_LEN} characters of letters, "
                                         f"digits, _ . : -")]


def _extra_shape(x):
    if x is None:
        return {}
    if not isinstance(x, dict):
        raise PydanticCustomError("malformed", "must be a dict {shape}, got {got}",
                                  {"shape": "{name: number}", "got": type(x).__name__})
    if len(x) > MAX_EXTRA_KEYS:
        raise PydanticCustomError("malformed", "has {n} fields; at most {most}", {"n": len(x), "most": MAX_EXTRA_KEYS})
    return x


#: a heartbeat's ``extra`` (the cost selector's inputs: ``queued_tokens``, ``inflight``, ``t_p_s``,
#: ``replicas``): ``{name: finite number >= 0}``, at most MAX_EXTRA_KEYS names of at most MAX_EXTRA_KEY_LEN
#: characters; None is none
HeartbeatExtra = Annotated[Dict[ExtraKey, Number], BeforeValidator(_extra_shape)]


def _rtts_shape(x, info: ValidationInfo):
    if not x:
        return {}
    most = (info.context or {}).get("max_regions")
    if not isinstance(x, dict) or (most is not None and len(x) > most):
        raise PydanticCustomError("malformed", "must be a dict {shape} of at most {most} peers",
                                  {"shape": "{peer: seconds}", "most": most if most is not None else "max_regions"})
    return x


class Heartbeat(BaseModel):
    """One heartbeat (see :meth:`RegistryState.heartbeat_batch` for what the registry does with it).

    Validation context (the registry's): ``regions`` (the names it serves, or None: any) and
    ``max_regions`` (the most RTT rows). Fields the registry reads apart -- ``prefix_summary``,
    ``snapshot_delta`` (``snapshot_sync.SnapshotDelta``), ``token`` -- and unknown ones are left to it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    region: RegionName
    #: the ingress replica (None: the region itself)
    source: Optional[SourceName] = None
    available_replicas: Count
    queue_len: Count = 0
    #: the RTTs the sender measured, ``{peer: seconds}``: validated as read, an RTT to itself, a peer the
    #: registry does not serve or a bad name left out (the registry names the ones left out)
    rtts: Annotated[Dict[Any, Any], BeforeValidator(_rtts_shape)] = Field(default_factory=dict)
    #: the sender's one-way delay to the registry (half its last round trip): its figures are that old
    delay_s: Optional[Delay] = None
    extra: HeartbeatExtra = Field(default_factory=dict)
    #: the prefix summary in wire form (``PrefixSummary.to_wire``), validated by the registry
    prefix_summary: Optional[Any] = None

    @model_validator(mode="before")
    @classmethod
    def _a_dict(cls, item):
        if not isinstance(item, (dict, Heartbeat)):
            raise PydanticCustomError("malformed", "must be a dict, got {got}", {"got": type(item).__name__})
        return item

    @field_validator("region")
    @classmethod
    def _served(cls, region: str, info: ValidationInfo) -> str:
        regions = (info.context or {}).get("regions")
        if regions is not None and region not in regions:
            raise PydanticCustomError("unknown_region", "{region} is not one of this registry's regions {regions}",
                                      {"region": repr(region), "regions": str(sorted(regions)[:16])})
        return region

    @field_validator("rtts")
    @classmethod
    def _known_peers(cls, rtts: dict, info: ValidationInfo) -> Dict[str, float]:
        region = info.data.get("region")
        regions = (info.context or {}).get("regions")
        out = {}
        for peer, v in rtts.items():
            if peer == region or not (_is_region(peer) if regions is None else peer in regions):
                continue
            try:
                out[peer] = float(number_adapter.validate_python(v))
            except ValidationError as e:
                msg = e.errors(include_input=False)[0]["msg"]
                raise PydanticCustomError("malformed", "[{peer}]: {msg}", {"peer": repr(peer), "msg": msg}) from None
        return out

    def wire(self) -> Dict[str, Any]:
        """The message as it travels: a plain dict, ``delay_s``, ``extra`` and ``prefix_summary`` left out
        when there are none."""
        d = self.model_dump(exclude_none=True)
        if not d["extra"]:
            del d["extra"]
        return d


def _is_region(name) -> bool:
    try:
        region_name_adapter.validate_python(name)
        return True
    except ValidationError:
        return False


region_name_adapter = TypeAdapter(RegionName)
number_adapter = TypeAdapter(Number)
extra_adapter = TypeAdapter(HeartbeatExtra)


def first_error(e: ValidationError, what: str, fields: int = 1) -> Tuple[str, str]:
    """``(code, message)`` for a refused message: the first error pydantic found (fields are checked in
    their order), its type as the code when it is a registry refusal code (``bad_name``,
    ``unknown_region``) else ``malformed``, and a message naming where: ``what`` and the error's location
    (the first ``fields`` parts are attribute names; then list indexes ``[i]``, dict keys ``['k']``)."""
    err = e.errors(include_input=False, include_url=False)[0]
    parts, prev = [what], None
    for i, part in enumerate(err["loc"]):
        if part == "[key]":  # a dict key: the path is the dict, the message names the key's problem
            parts.pop()
            break
        if i < fields or (isinstance(prev, int) and isinstance(part, str)):
            parts.append(f".{part}")  # an attribute (of the message, or of a model in a list)
        else:
            parts.append(f"[{part!r}]" if isinstance(part, str) else f"[{part}]")
        prev = part
    path = "".join(parts)
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    code = err["type"] if err["type"] in ("bad_name", "unknown_region") else "malformed"
    return code, (f"{path}{msg}" if msg.startswith("[") else f"{path}: {msg}")


def validate_extra(extra, what: str = "heartbeat.extra") -> Dict[str, float]:
    """A heartbeat's ``extra`` read as :data:`HeartbeatExtra`. Raises ValueError naming the problem."""
    try:
        return extra_adapter.validate_python(extra)
    except ValidationError as e:
        raise ValueError(first_error(e, what, fields=0)[1]) from None


def heartbeat_message(region: str, source: str, available_replicas: int, queue_len: int,
                      rtts: Mapping[str, float], extra: Optional[Mapping[str, Any]] = None,
                      prefix_summary: Optional[dict] = None, delay_s: Optional[float] = None) -> Dict[str, Any]:
    """This region's heartbeat, validated (:class:`Heartbeat`) and in wire form: its figures (available
    replicas, LB queue length), the RTTs it measured to its peers (``RegionRouter.measured_rtts``), the
    cost selector's ``extra`` (left out when empty), its prefix summary in wire form when this heartbeat
    carries one (``SummarySendRule.wire``), and ``delay_s``, the one-way delay to the registry it declares
    (half its last registry round trip; left out until known -- ``RegistryClient`` adds it to the
    ingress's heartbeats). Raises ValueError naming the field for a value out of its bounds."""
    try:
        hb = Heartbeat(region=region, source=source, available_replicas=available_replicas, queue_len=queue_len,
                       rtts=dict(rtts), extra=dict(extra) if extra else None, prefix_summary=prefix_summary,
                       delay_s=delay_s)
    except ValidationError as e:
        raise ValueError(first_error(e, "heartbeat")[1]) from None
    return hb.wire()
