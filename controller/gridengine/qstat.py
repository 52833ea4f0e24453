"""qstat's XML as values: the live list (``qstat -f -xml -u USER``), the details of some
jobs (``qstat -j ID,ID,... -xml``) and the hold filters (``qstat -xml -u USER -s hu``).
Pure: text in, frozen values out; anything not of the expected shape is a
``ProtocolError``, never a guess.

What each form has (testdata/gridengine/NOTES.md, Son of Grid Engine 8.1.9):

* the list: per job its number, name, owner, state letters, its queue instance
  (``q@host``: running jobs sit under their ``Queue-List``) and one time, the start time
  of a running job or the submission time of a pending one, as ISO-8601 *local* time
  without a zone (the runners run every command with ``TZ=UTC``); with ``-f`` also each
  queue instance's state letters (``u``: its execd unheard for ``max_unheard``). It has
  no submission time of a running job and no account string;
* the details: ``JB_submission_time`` (integer epoch seconds), ``JB_account``,
  ``JB_context`` (``-ac`` variables), ``JB_restart`` (``-r``: 1 yes), the hard
  resource requests (``h_rt``) and per task its start time and messages (an ``Eqw``
  job's reason);
* the hold filters: which pending jobs carry a user (``hu``), operator (``ho``) or
  system (``hs``) hold; the list shows ``hqw`` for all three.
"""

from __future__ import annotations

import calendar
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Final

from controller.errors import ProtocolError

_ISO: Final = "%Y-%m-%dT%H:%M:%S"
_STATE_RE = re.compile(r"[A-Za-z]{1,8}")


@dataclass(frozen=True, slots=True)
class ListedJob:
    """One ``job_list`` element of the list (an array job's running task is one each)."""

    number: int
    name: str
    owner: str
    state: str  # the letters, e.g. "r", "hqw", "Eqw", "dr"
    queue: str  # "q@host" when running; "" when pending
    time: int | None  # start time (running) or submission time (pending), epoch seconds
    slots: int
    tasks: str = ""

    @property
    def host(self) -> str:
        return self.queue.rpartition("@")[2] if "@" in self.queue else ""


@dataclass(frozen=True, slots=True)
class QueueInstance:
    name: str  # "q@host"
    state: str  # letters, "" when well

    @property
    def host(self) -> str:
        return self.name.rpartition("@")[2]


@dataclass(frozen=True, slots=True)
class LiveList:
    jobs: tuple[ListedJob, ...]
    queues: tuple[QueueInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class JobDetail:
    """What ``qstat -j`` says of one job."""

    number: int
    name: str
    owner: str
    submit: int
    account: str | None
    context: tuple[tuple[str, str], ...] = ()
    rerunnable: bool = False
    h_rt: int | None = None
    start: int | None = None  # the first task's start time, when it has started
    messages: tuple[str, ...] = field(default=())

    def context_value(self, name: str) -> str | None:
        return dict(self.context).get(name)


def local_time(text: str | None) -> int | None:
    """Epoch seconds of qstat's zone-less ISO time, read as UTC (the runners' TZ)."""
    if not text:
        return None
    try:
        return calendar.timegm(time.strptime(text, _ISO))
    except ValueError as exc:
        raise ProtocolError(f"qstat: not a time: {text!r:.40}") from exc


def _root(text: str, what: str) -> ET.Element:
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        raise ProtocolError(f"{what}: not XML: {exc}") from exc


def _text(element: ET.Element, tag: str, *, what: str, required: bool = True) -> str:
    child = element.find(tag)
    if child is None:
        if required:
            raise ProtocolError(f"{what}: no <{tag}>")
        return ""
    return child.text or ""


def _int(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ProtocolError(f"{what}: not a number: {text!r:.40}")
    return int(text)


def _listed(element: ET.Element, queue: str) -> ListedJob:
    what = "qstat job_list"
    state = _text(element, "state", what=what)
    if _STATE_RE.fullmatch(state) is None:
        raise ProtocolError(f"{what}: not a state: {state!r:.20}")
    time_text = (_text(element, "JAT_start_time", what=what, required=False)
                 or _text(element, "JB_submission_time", what=what, required=False))
    return ListedJob(
        number=_int(_text(element, "JB_job_number", what=what), what),
        name=_text(element, "JB_name", what=what),
        owner=_text(element, "JB_owner", what=what),
        state=state,
        queue=queue or _text(element, "queue_name", what=what, required=False),
        time=local_time(time_text),
        slots=_int(_text(element, "slots", what=what) or "0", what),
        tasks=_text(element, "tasks", what=what, required=False))


def parse_list(text: str) -> LiveList:
    """``qstat [-f] -xml -u USER``: every job listed, and (with ``-f``) every queue
    instance with its state."""
    root = _root(text, "qstat -xml")
    if root.tag != "job_info":
        raise ProtocolError(f"qstat -xml: unexpected root <{root.tag}>")
    jobs: list[ListedJob] = []
    queues: list[QueueInstance] = []
    for section in root:
        if section.tag not in ("queue_info", "job_info"):
            continue
        for element in section:
            if element.tag == "Queue-List":
                name = _text(element, "name", what="qstat Queue-List")
                queues.append(QueueInstance(name, _text(element, "state",
                                                        what="qstat Queue-List",
                                                        required=False)))
                jobs.extend(_listed(job, name) for job in element.findall("job_list"))
            elif element.tag == "job_list":
                jobs.append(_listed(element, ""))
    return LiveList(tuple(jobs), tuple(queues))


def parse_numbers(text: str) -> frozenset[int]:
    """The job numbers of a filtered list (``-s hu``, ``-s ho``, ``-s hs``)."""
    return frozenset(job.number for job in parse_list(text).jobs)


def parse_details(text: str) -> dict[int, JobDetail]:
    """``qstat -j ID,... -xml``: the details of each job it knows (unknown ids are
    simply absent: qstat lists them under ``unknown_jobs`` and exits 0)."""
    root = _root(text, "qstat -j -xml")
    if root.tag == "unknown_jobs":
        return {}
    if root.tag != "detailed_job_info":
        raise ProtocolError(f"qstat -j -xml: unexpected root <{root.tag}>")
    found: dict[int, JobDetail] = {}
    info = root.find("djob_info")
    for element in info if info is not None else ():
        detail = _detail(element)
        found[detail.number] = detail
    return found


def _detail(element: ET.Element) -> JobDetail:
    what = "qstat -j job"
    number = _int(_text(element, "JB_job_number", what=what), what)
    context = tuple(
        (_text(var, "VA_variable", what=what), _text(var, "VA_value", what=what,
                                                     required=False))
        for var in element.findall("JB_context/context_list"))
    h_rt = None
    for request in element.findall("JB_hard_resource_list/qstat_l_requests"):
        if _text(request, "CE_name", what=what, required=False) == "h_rt":
            value = _text(request, "CE_doubleval", what=what, required=False)
            try:
                h_rt = int(float(value))
            except ValueError:
                h_rt = None
    start = None
    messages: list[str] = []
    for task in element.findall("JB_ja_tasks/ulong_sublist"):
        started = _text(task, "JAT_start_time", what=what, required=False)
        if started.isascii() and started.isdigit() and int(started) > 0 and start is None:
            start = int(started)
        messages += [" ".join((m.text or "").split())
                     for m in task.findall("JAT_message_list/ulong_sublist/QIM_message")]
    account = element.find("JB_account")
    return JobDetail(
        number=number,
        name=_text(element, "JB_job_name", what=what),
        owner=_text(element, "JB_owner", what=what),
        submit=_int(_text(element, "JB_submission_time", what=what), what),
        account=None if account is None else (account.text or ""),
        context=context,
        rerunnable=_text(element, "JB_restart", what=what, required=False) == "1",
        h_rt=h_rt, start=start, messages=tuple(messages))
