"""Numbers on the command line are read as a person writes them (issue 35, faults): Python's
``int``/``float`` read ``1_0`` as 10, and ``nan``, ``inf`` and full-width digits as numbers;
every integer and real option, and every number in ``--sampling``, refuses them with a message
naming the option (exit 2, nothing run)."""

from __future__ import annotations

import pytest

from specproof.cli import main
from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampling import parse_sampling
from specproof.contract.validation import INTEGER_TEXT, NUMBER_TEXT, decimal_int, decimal_number

INT = "must be a decimal integer (digits, an optional sign; no underscores or other bases)"
REAL = "must be a finite decimal number (e.g. 0.8 or 1e-3; no underscores, hex, nan or inf)"


@pytest.mark.parametrize("text", ["1_0", "0x10", "1e3", "1.0", "", "+", "１０", "ten", "10 0"])
def test_decimal_int_refuses_what_is_not_plain_digits(text: str) -> None:
    with pytest.raises(InvalidSettingError) as err:
        decimal_int(text)
    assert str(err.value) == INTEGER_TEXT


@pytest.mark.parametrize("text", ["1_0", "0x1p3", "nan", "inf", "-inf", "Infinity", "1e999", "", ".", "e3", "1,5"])
def test_decimal_number_refuses_what_is_not_a_finite_decimal(text: str) -> None:
    with pytest.raises(InvalidSettingError) as err:
        decimal_number(text)
    assert str(err.value) == NUMBER_TEXT


@pytest.mark.parametrize(("text", "value"), [("10", 10), ("-3", -3), ("+7", 7), (" 8 ", 8), ("007", 7)])
def test_decimal_int_reads_plain_integers(text: str, value: int) -> None:
    assert decimal_int(text) == value


@pytest.mark.parametrize(("text", "value"), [("0.8", 0.8), ("1", 1.0), ("-2.5", -2.5), ("1e-3", 1e-3), (".5", 0.5)])
def test_decimal_number_reads_plain_numbers(text: str, value: float) -> None:
    assert decimal_number(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("temperature=1_0", f"sampling temperature='1_0' {REAL}"),
        ("temperature=nan", f"sampling temperature='nan' {REAL}"),
        ("temperature=inf", f"sampling temperature='inf' {REAL}"),
        ("temperature=0.8,top_p=0x1", f"sampling top_p='0x1' {REAL}"),
        ("temperature=0.8,top_k=1_0", f"sampling top_k='1_0' {INT}"),
        ("temperature=0.8,seed=1.5", f"sampling seed='1.5' {INT}"),
    ],
)
def test_sampling_numbers_are_strict(text: str, message: str) -> None:
    with pytest.raises(InvalidSettingError) as err:
        parse_sampling(text)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["certify", "--seed", "1_0"], f"specproof certify: error: argument --seed: '1_0' {INT}"),
        (["certify", "--max-context", "1e3"], f"specproof certify: error: argument --max-context: '1e3' {INT}"),
        (["certify", "--atol", "nan"], f"specproof certify: error: argument --atol: 'nan' {REAL}"),
        (["certify", "--tie-tolerance", "inf"], f"specproof certify: error: argument --tie-tolerance: 'inf' {REAL}"),
        (
            ["certify", "--sampling", "temperature=1_0"],
            f"specproof certify: error: --sampling: sampling temperature='1_0' {REAL}",
        ),
        (["generate", "-k", "0x4"], f"specproof generate: error: argument -k: '0x4' {INT}"),
        (["generate", "--max-new-tokens", "1_0"], f"specproof generate: error: argument --max-new-tokens: '1_0' {INT}"),
        (["generate", "--eos", "nan"], f"specproof generate: error: argument --eos: 'nan' {INT}"),
        (
            ["generate", "--ids", "1_0,2"],
            "specproof generate: error: --ids '1_0,2': expected decimal integers separated by commas or spaces",
        ),
        (["fuzz", "drafter", "--rounds", "1_0"], f"specproof fuzz: error: argument --rounds: '1_0' {INT}"),
        (["fuzz", "drafter", "--workers", "0x2"], f"specproof fuzz: error: argument --workers: '0x2' {INT}"),
        (
            ["bundle", "export", "out.mlpackage", "--k", "4.0"],
            f"specproof bundle export: error: argument --k: '4.0' {INT}",
        ),
    ],
)
def test_a_number_option_that_is_not_plain_decimal_is_a_usage_error_naming_it(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        code = main(argv)
        raise SystemExit(code)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == line, err
