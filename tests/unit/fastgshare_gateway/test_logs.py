"""The pure part of ``GET /system/logs``: the query faas-cli sends, read as faas-provider reads it (with a
400 naming each bad parameter), the kubelet's timestamped lines, and the NDJSON messages."""

from __future__ import annotations

import datetime
import json

import pytest

from fastgshare_gateway import kube, logs
from fastgshare_gateway.logs import LogQuery, LogQueryError, parse_query

UTC = datetime.UTC


def test_the_query_faas_cli_sends_is_read_as_faas_provider_reads_it() -> None:
    # faas-cli logs hello --tail 5 --since 10m -f, in the order faas-cli's client writes it
    query = parse_query({"name": "hello", "namespace": "fast-gshare-fn", "instance": "", "tail": "5",
                         "follow": "true", "since": "2026-12-04T03:12:25.5Z"})
    assert query == LogQuery(name="hello", namespace="fast-gshare-fn", instance=None,
                             since=datetime.datetime(2026, 12, 4, 3, 12, 25, 500000, tzinfo=UTC), tail=5, follow=True)


def test_defaults_and_the_dotted_name_form() -> None:
    assert parse_query({"name": "hello"}) == LogQuery("hello", None, None, None, None, False)
    assert parse_query({"name": "hello.team-a"}).namespace == "team-a"
    assert parse_query({"name": "hello.team-a", "namespace": "team-a"}).namespace == "team-a"
    assert parse_query({"name": "hello", "instance": "hello-q40-s12-abcde"}).instance == "hello-q40-s12-abcde"


@pytest.mark.parametrize(("tail", "expected"), [("0", None), ("-1", None), ("3", 3), ("20000", 10_000)])
def test_tail_zero_or_less_is_all_and_a_tail_is_capped(tail: str, expected: int | None) -> None:
    assert parse_query({"name": "f", "tail": tail}).tail == expected


@pytest.mark.parametrize(("yes", "no"), [("1", "0"), ("t", "f"), ("T", "F"), ("TRUE", "FALSE"), ("true", "false"),
                                         ("True", "False")])
def test_follow_takes_what_gos_parse_bool_takes(yes: str, no: str) -> None:
    assert parse_query({"name": "f", "follow": yes}).follow is True
    assert parse_query({"name": "f", "follow": no}).follow is False


@pytest.mark.parametrize(("query", "named"), [
    ({}, "name: missing"),
    ({"name": "Hello"}, "name 'Hello'"),
    ({"name": "a=b,c"}, "name 'a=b,c'"),  # would widen the pods' label selector
    ({"name": "f", "namespace": "Team A"}, "namespace 'Team A'"),
    ({"name": "f.a", "namespace": "b"}, "name 'f.a' and namespace 'b'"),
    ({"name": "f", "instance": "pod/x"}, "instance 'pod/x'"),
    ({"name": "f", "tail": "ten"}, "tail 'ten'"),
    ({"name": "f", "tail": "1.5"}, "tail '1.5'"),
    ({"name": "f", "follow": "yes"}, "follow 'yes'"),
    ({"name": "f", "since": "10m"}, "since '10m'"),
    ({"name": "f", "since": "2026-12-04"}, "since '2026-12-04'"),
    ({"name": "f", "since": "2026-12-04T03:12:25"}, "since '2026-12-04T03:12:25'"),  # no zone
    ({"name": "f", "since": "2026-13-04T03:12:25Z"}, "since '2026-13-04T03:12:25Z'"),
])
def test_bad_input_is_a_400_line_naming_the_parameter_and_what_is_allowed(query: dict[str, str], named: str) -> None:
    with pytest.raises(LogQueryError) as raised:
        parse_query(query)
    assert raised.value.status == 400
    assert raised.value.message.startswith(named)
    assert "\n" not in raised.value.message
    assert any(word in raised.value.message for word in ("expected", "give", "missing", "valid"))


def test_a_kubelet_line_splits_into_its_timestamp_and_its_text() -> None:
    assert logs.split_line("2026-12-04T03:22:25.123456789Z served /predict in 12 ms") == (
        "2026-12-04T03:22:25.123456789Z", "served /predict in 12 ms")
    assert logs.split_line("2026-12-04T03:22:25Z ") == ("2026-12-04T03:22:25Z", "")
    assert logs.split_line("2026-12-04T03:22:25Z") == ("2026-12-04T03:22:25Z", "")
    assert logs.split_line("no timestamp here") == (logs.ZERO_TIME, "no timestamp here")


def test_since_becomes_whole_seconds_and_earlier_lines_are_dropped_by_their_timestamp() -> None:
    now = datetime.datetime(2026, 12, 4, 3, 30, 0, tzinfo=UTC)
    since = datetime.datetime(2026, 12, 4, 3, 20, 0, 250000, tzinfo=UTC)
    assert logs.since_seconds(since, now) == 600  # 599.75 s, rounded up: nothing after since is lost
    assert logs.since_seconds(now + datetime.timedelta(hours=1), now) == 1  # the API server wants >= 1
    assert logs.since_seconds(None, now) is None
    assert not logs.after("2026-12-04T03:20:00.249999999Z", since)
    assert logs.after("2026-12-04T03:20:00.25Z", since)
    assert logs.after(logs.ZERO_TIME, None)


def test_a_message_is_one_ndjson_line_with_faas_providers_fields() -> None:
    message = logs.message_line("hello", "fast-gshare-fn", "hello-q40-s12-x7k2p",
                                "2026-12-04T03:22:25.1Z réponse {\"ok\": true}")
    line = message.line()
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert json.loads(line) == {"name": "hello", "namespace": "fast-gshare-fn", "instance": "hello-q40-s12-x7k2p",
                                "timestamp": "2026-12-04T03:22:25.1Z", "text": "réponse {\"ok\": true}"}


def test_messages_sort_by_time_across_pods_whatever_the_digits_of_their_fractions() -> None:
    lines = [("b", "2026-12-04T03:22:25.2Z two"), ("a", "2026-12-04T03:22:25.123456789Z one"),
             ("a", "2026-12-04T03:22:26Z three"), ("b", "no time zero")]
    messages = sorted((logs.message_line("f", "ns", pod, line) for pod, line in lines), key=logs.Message.sort_key)
    assert [m.text for m in messages] == ["no time zero", "one", "two", "three"]


class ChunkedAnswer:
    """What the kubernetes client hands back for a log read: chunks cut anywhere."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amount: None, decode_content: bool) -> list[bytes]:
        return self.chunks

    def release_conn(self) -> None:
        pass


def test_a_pod_log_is_cut_into_lines_wherever_its_chunks_end_and_a_huge_line_is_bounded() -> None:
    stream = kube._PodLogStream(ChunkedAnswer([b"2026-12-04T03:22:25Z fir", b"st\n2026-12-04T03:22:26Z s",
                                               b"\xc3", b"\xa9cond\n\nlast without newline"]))
    assert list(stream) == ["2026-12-04T03:22:25Z first", "2026-12-04T03:22:26Z s\u00e9cond", "",
                            "last without newline"]
    huge = kube._PodLogStream(ChunkedAnswer([b"x" * (kube.MAX_LINE_BYTES * 2 + 10) + b"\nend\n"]))
    assert [len(line) for line in huge] == [kube.MAX_LINE_BYTES, kube.MAX_LINE_BYTES, 10, 3]
