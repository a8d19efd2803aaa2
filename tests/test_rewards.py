"""reward.functions: the built-in rewards, several functions per sample in the verifier's workers, their
limits and errors, and the config forms (end-to-end runs: test_reward_runs.py)."""

import math

import pytest
import yaml

from thinkrl.config.rollout import RewardFunction, default_reward_functions
from thinkrl.errors import UserError
from thinkrl.rewards import format_boxed, format_think, length_penalty
from thinkrl.settings import load_config, save_config
from thinkrl.verifier import VerifierPool, grade, rewards
from thinkrl.verifier.rewards import RewardSet


def entries(*items):
    return [RewardFunction(*item) for item in items]


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(workers=2, timeout=10) as p:
        yield p


# --- the built-ins, on hand examples


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is \\boxed{42}.", 1.0),
        ("\\boxed{x^2} then \\boxed{ }", 0.0),  # the final answer is the last box: empty
        ("\\boxed{x^2} then \\boxed{unclosed", 1.0),  # the last box that closes
        ("the answer is 42", 0.0),
        ("\\boxed{}", 0.0),
        ("\\boxed{   }", 0.0),
        ("\\boxed{" + "1" * 1001 + "}", 0.0),  # longer than the verifier reads
        ("\\boxed{unclosed", 0.0),
    ],
)
def test_format_boxed(text, expected):
    assert format_boxed(text, "42") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>add 2 and 2</think> The answer is \\boxed{4}.", 1.0),
        ("add 2 and 2\n</think>\n4", 1.0),  # the template opened the tag in the prompt
        ("  <think>\nadd\n</think>\n\n4  ", 1.0),
        ("<think></think> 4", 0.0),  # no reasoning
        ("<think>add 2 and 2</think>   ", 0.0),  # no answer
        ("<think>add 2 and 2 ... 4", 0.0),  # never closed
        ("The answer is 4.", 0.0),
        ("<think>a</think> b <think>c</think> d", 0.0),  # a second block
        ("<think>a <think> b</think> 4", 0.0),
        ("4 <think>a</think> 5", 0.0),  # the tag is not at the start
    ],
)
def test_format_think(text, expected):
    assert format_think(text, "4") == expected


def test_length_penalty():
    assert length_penalty("", "1") == 0.0
    assert length_penalty("x" * 1000, "1") == -0.25  # default max_chars=4000
    assert length_penalty("x" * 5, "1", max_chars=20) == -0.25
    assert length_penalty("x" * 20, "1", max_chars=20) == -1.0
    assert length_penalty("x" * 10**6, "1", max_chars=20) == -1.0  # floored
    with pytest.raises(ValueError, match="max_chars"):
        length_penalty("x", "1", max_chars=0)


# --- several functions per sample in the pool, with its limits


def test_the_pool_runs_several_functions_per_sample_in_its_own_workers(pool):
    texts = ["so \\boxed{4}", "<think>hm</think> 5", "\\boxed{}", "a" * 30]
    answers = ["4", "5", "1", "2"]
    specs = [("thinkrl.rewards:format_boxed", {}), ("helpers:distinct_chars", {}), ("thinkrl.rewards:length_penalty", {"max_chars": 20})]
    pids = pool.pids
    scores, extracted, values, stats = pool.evaluate(texts, answers, specs)
    assert pool.pids == pids  # no process started for the reward functions
    assert (scores, extracted) == tuple(map(list, zip(*(grade(t, a) for t, a in zip(texts, answers)))))
    assert scores == [1.0, 1.0, 0.0, 0.0] and stats == {"timeouts": 0, "crashes": 0, "errors": 0}
    assert values == [
        [("ok", format_boxed(t, "")) for t in texts],
        [("ok", min(len(set(t)), 20) / 20) for t in texts],
        [("ok", length_penalty(t, "", max_chars=20)) for t in texts],
    ]
    assert [v for _, v in values[0]] == [1.0, 0.0, 0.0, 0.0] and values[2][3] == ("ok", -1.0)


def test_reward_set_weighs_the_values_and_names_the_means(pool):
    rs = RewardSet(
        entries(
            ("correct", "verifier", 2.0),
            ("boxed", "thinkrl.rewards:format_boxed", 0.5),
            ("short", "thinkrl.rewards:length_penalty", 0.25, {"max_chars": 10}),
        )
    )
    scores, _, parts, stats = rs.evaluate(pool, ["\\boxed{4}", "\\boxed{5}", "no"], ["4", "4", "4"])
    assert scores == [1.0, 0.0, 0.0] and stats == {"timeouts": 0, "crashes": 0, "errors": 0}
    assert parts == [[1.0, 1.0, -0.9], [0.0, 1.0, -0.9], [0.0, 0.0, -0.2]]
    assert rs.totals(parts) == pytest.approx([2.0 + 0.5 - 0.225, 0.5 - 0.225, -0.05])
    assert rs.means(parts) == pytest.approx({"reward/correct": 1 / 3, "reward/boxed": 2 / 3, "reward/short": -2.0 / 3})
    nothing = rs.means([])  # a step that kept no group has no mean: NaN, never a 0 that reads as one
    assert list(nothing) == ["reward/correct", "reward/boxed", "reward/short"] and all(math.isnan(v) for v in nothing.values())


def test_the_default_is_the_verifier_alone_and_logs_nothing_new(pool):
    rs = RewardSet(default_reward_functions())
    scores, _, parts, stats = rs.evaluate(pool, ["\\boxed{4}", "\\boxed{3}"], ["4", "4"])
    assert not rs.custom and not rs.specs and stats == {"timeouts": 0, "crashes": 0, "errors": 0}
    assert rs.totals(parts) == scores == [1.0, 0.0] and rs.means(parts) == {}


def test_a_timed_out_user_function_scores_0_and_is_counted():
    rs = RewardSet(entries(("correct", "verifier", 1.0), ("slow", "helpers:sleepy_reward", 1.0)))
    with VerifierPool(workers=1, timeout=1.0) as p:
        scores, _, parts, stats = rs.evaluate(p, ["sleep", "\\boxed{3}"], ["1", "3"])
    assert stats == {"timeouts": 1, "crashes": 0, "errors": 0}
    assert scores == [0.0, 1.0] and parts == [[0.0, 0.0], [1.0, 0.5]]  # the grading of "sleep" was not lost


def test_an_exception_scores_0_and_is_counted(pool):
    rs = RewardSet(entries(("odd", "helpers:odd_reward", 1.0)))
    _, _, parts, stats = rs.evaluate(pool, ["raise", "fine"], ["1", "1"])
    assert parts == [[0.0], [1.0]] and stats["errors"] == 1


@pytest.mark.parametrize("text, shown", [("text", "returned 'high' (str), not a number"), ("nan", "returned nan, not a finite number")])
def test_a_value_that_is_not_a_finite_number_is_a_one_line_error(pool, text, shown):
    rs = RewardSet(entries(("correct", "verifier", 1.0), ("odd", "helpers:odd_reward", 1.0)))
    with pytest.raises(UserError) as e:
        rs.evaluate(pool, ["fine", text], ["1", "1"])
    assert str(e.value) == f"reward.functions odd (helpers:odd_reward) {shown}; a reward function must return a finite number"
    assert pool.evaluate(["\\boxed{2}"], ["2"])[0] == [1.0]  # the pool is still in step


FAILS = "helpers:failing_reward"


@pytest.mark.parametrize("how, first", [("raise", "KeyError: 'score_key'"), ("exit", "SystemExit: 3")])
def test_a_function_that_fails_on_every_text_stops_like_a_broken_grader(pool, how, first):
    """Before: every value 0, counted in verifier/errors only, and the run went on (exit 0)."""
    rs = RewardSet(entries(("correct", "verifier", 1.0), ("broken", FAILS, 1.0, {"how": how})))
    with pytest.raises(UserError) as e:
        rs.evaluate(pool, ["a", "bb", "ccc"], ["1", "1", "1"])
    assert str(e.value) == (
        f"reward.functions broken ({FAILS}) failed on every one of the 3 completions graded together (the first: {first}), "
        "so the function is broken, not the text; fix it (call it on one completion to see the traceback)"
    )
    assert pool.evaluate(["\\boxed{2}"], ["2"])[0] == [1.0]  # the pool is still in step


def test_a_function_that_times_out_on_every_text_stops_naming_the_limit():
    rs = RewardSet(entries(("slow", FAILS, 1.0, {"how": "sleep"})))
    with VerifierPool(workers=2, timeout=1.0) as p, pytest.raises(UserError) as e:
        rs.evaluate(p, ["a", "b"], ["1", "1"])
    every = "failed on every one of the 2 completions graded together (the first: ran past verifier.timeout=1 s)"
    assert str(e.value).startswith(f"reward.functions slow ({FAILS}) {every}"), str(e.value)


def test_max_failure_share_stops_at_that_share_and_fewer_failures_are_counted(pool):
    texts, answers = ["raise", "fine", "fine", "fine"], ["1"] * 4
    tolerant = RewardSet(entries(("odd", "helpers:odd_reward", 1.0)))  # the default: only a failure on every text stops
    assert tolerant.evaluate(pool, texts, answers)[2] == [[0.0], [1.0], [1.0], [1.0]]
    assert RewardSet(entries(("odd", "helpers:odd_reward", 1.0)), max_failure_share=0.3).evaluate(pool, texts, answers)[3]["errors"] == 1
    with pytest.raises(UserError) as e:
        RewardSet(entries(("odd", "helpers:odd_reward", 1.0)), max_failure_share=0.25).evaluate(pool, texts, answers)
    assert str(e.value).startswith(
        "reward.functions odd (helpers:odd_reward) failed on 1 of the 4 completions graded together (the first: KeyError: 'raise'), "
        "reward.max_failure_share=0.25 or more, so the function is broken"
    ), str(e.value)


def test_a_weighted_sum_that_overflows_is_a_one_line_error_naming_function_and_weight(pool):
    """Before: 1e308 x 10 = inf as the shaped reward, all advantages 0 (or NaN), exit 0."""
    rs = RewardSet(entries(("correct", "verifier", 1.0), ("huge", FAILS, 10.0, {"how": "huge"})))
    with pytest.raises(UserError) as e:
        rs.evaluate(pool, ["a", "b"], ["1", "1"])
    assert str(e.value) == (
        f"reward.functions huge ({FAILS}) returned 1e+308 x weight 10: the weighted sum inf is not a finite number as the "
        "float32 the advantages use (at most 3.403e+38); lower the weight or bound what the function returns"
    )
    two = RewardSet(entries(("a", "helpers:distinct_chars", 1.0), ("b", "helpers:distinct_chars", 2.0)))
    assert two.totals([[1.0, 2.0]]) == [5.0]
    with pytest.raises(UserError, match=r"^reward.functions a \(helpers:distinct_chars\) returned 2e\+38 x weight 1 and b "):
        two.totals([[2e38, 1e38]])  # each term is a float32, their sum is not


@pytest.mark.parametrize(
    "function, options, message",
    [
        ("no_such_module:f", {}, "reward.functions r: function='no_such_module:f' could not be loaded (No module named 'no_such_module')"),
        ("thinkrl.verifier.rewards:VERIFIER", {}, "reward.functions r: function='thinkrl.verifier.rewards:VERIFIER' is not a function"),
        ("thinkrl.rewards:length_penalty", {"max_char": 5}, "reward.functions r: thinkrl.rewards:length_penalty cannot be called as"),
        ("helpers:distinct_chars", {"x": 1}, "fn(completion, answer, x=...)"),
    ],
)
def test_a_function_that_cannot_be_used_is_a_one_line_error_at_load(function, options, message):
    with pytest.raises(UserError) as e:
        RewardSet(entries(("r", function, 1.0, options)))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_call_reports_a_function_the_worker_cannot_load():
    kind, why = rewards.call(("no_such_module:f", {}), "x", "1", {})
    assert kind == "bad" and why.startswith("could not be loaded in a verifier worker")


# --- the config: -o and YAML lists, checks, round trip

FUNCTIONS = (
    "[{name: correct, function: verifier, weight: 1}, {name: fmt, function: thinkrl.rewards:format_boxed, weight: 0.5},"
    " {name: len, function: thinkrl.rewards:length_penalty, weight: 0.1, options: {max_chars: 100}}]"
)
EXPECTED = entries(
    ("correct", "verifier", 1.0),
    ("fmt", "thinkrl.rewards:format_boxed", 0.5),
    ("len", "thinkrl.rewards:length_penalty", 0.1, {"max_chars": 100}),
)


def test_functions_from_an_override_and_a_yaml_file_round_trip(tmp_path):
    assert load_config().reward.functions == default_reward_functions()
    cfg = load_config(overrides=[f"reward.functions={FUNCTIONS}"])
    assert cfg.reward.functions == EXPECTED
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"reward": {"functions": yaml.safe_load(FUNCTIONS)}}))
    assert load_config(path).reward.functions == EXPECTED
    save_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml").reward == cfg.reward


@pytest.mark.parametrize(
    "value, message",
    [
        ("[]", "reward.functions must hold at least one"),
        ("[{name: a, function: verifier}, {name: a, function: m:f}]", "reward.functions: the name 'a' is used twice"),
        ("[{name: std, function: verifier}]", "reward.functions: the name 'std' would overwrite the metric reward/std"),
        ("[{name: a, function: verifier, weight: .inf}]", "reward.functions[0]: weight must be a finite number, got inf"),
        ("[{name: a, function: verifier}, {name: b/c, function: m:f}]", "reward.functions[1]: name must be letters"),
        ("[{name: a, function: grade}]", "reward.functions[0]: function must be 'verifier' or module:function, got 'grade'"),
        ("[{name: a, funtion: m:f}]", "unknown key reward.functions[0].funtion (did you mean function?)"),
        ("thinkrl.rewards:format_boxed", "reward.functions[0]: expected a mapping of name, function, weight, options"),
    ],
)
def test_bad_functions_are_one_line_errors(value, message):
    with pytest.raises(UserError) as e:
        load_config(overrides=[f"reward.functions={value}"])
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
