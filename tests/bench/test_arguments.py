"""The benchmark CLIs refuse arguments that make no sense with argparse's usage error, before any rank starts."""

from __future__ import annotations

import pytest

from compcoll.bench import cli, model_cli
from compcoll.bench.arguments import above, at_least, listed, parse_count, parse_size


def test_sizes_and_counts_parse_with_their_units() -> None:
    assert parse_size("64K") == 65536 and parse_size("16MB") == 1 << 24 and parse_size("1.5k") == 1536
    assert parse_count("1.3B") == 1_300_000_000 and parse_count("300M") == 300_000_000 and parse_count("10") == 10


def test_the_types_take_what_they_allow() -> None:
    assert at_least(1)("3") == 3 and at_least(0, float)("0") == 0.0 and above(1)("1.5") == 1.5
    assert listed(at_least(1))("1,2,16") == [1, 2, 16] and listed(above(0))("0.5,10") == [0.5, 10.0]


@pytest.mark.parametrize("main, argv, message", [
    (cli.parse, ["-n", "0"], "argument -n/--iters: must be at least 1, got '0'"),
    (cli.parse, ["-r", "-2"], "argument -r/--runs: must be at least 1"),
    (cli.parse, ["-w", "-1"], "argument -w/--warmup: must be at least 0"),
    (cli.parse, ["-f", "1"], "argument -f/--factor: must be above 1"),
    (cli.parse, ["-f", "nan"], "argument -f/--factor: must be above 1"),
    (cli.parse, ["-b", "1K", "-e", "512"], "--begin (1024 B) is larger than --end (512 B)"),
    (cli.parse, ["-b", "abc"], "argument -b/--begin: invalid size value: 'abc'"),
    (cli.parse, ["--launch", "0"], "argument --launch: must be at least 1"),
    (cli.parse, ["--pieces", "0"], "argument --pieces: must be at least 1"),
    (cli.parse, ["-c", "2"], "argument -c/--check: invalid choice"),
    (model_cli.parser().parse_args, ["--nodes", "16,0"], "argument --nodes: must be at least 1, got '0'"),
    (model_cli.parser().parse_args, ["--nodes", "4,x"], "argument --nodes: invalid integer list value: '4,x'"),
    (model_cli.parser().parse_args, ["--gbit", "0"], "argument --gbit: must be above 0"),
    (model_cli.parser().parse_args, ["--params", "0"], "argument --params: must be at least 1"),
    (model_cli.parser().parse_args, ["--threads", "0"], "argument --threads: must be at least 1"),
    (model_cli.parser().parse_args, ["--ranks-per-node", "0"], "argument --ranks-per-node: must be at least 1"),
    (model_cli.parser().parse_args, ["--latency-us", "-5"], "argument --latency-us: must be at least 0"),
    (model_cli.parser().parse_args, ["--kernel-gbyte", "0"], "argument --kernel-gbyte: must be above 0"),
])
def test_a_bad_argument_is_a_usage_error_naming_it(main, argv: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Each of these divided by zero, ran nothing, or failed deep inside numba before."""
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2 and message in capsys.readouterr().err


def test_the_defaults_pass() -> None:
    args = cli.parse([])
    assert (args.begin, args.end, args.factor, args.iters) == (65536, 1 << 24, 4.0, 5)
    assert model_cli.parser().parse_args([]).nodes == [16, 32, 64, 128]
