"""How long each exercise takes and how hard it is, and the week it is due in the course: the one table the course
guide's weekly plan, each exercise's check note and the answer key read.

Minutes are an estimate for a first-year graduate student who has read the section, from the exercise's statement
and the length of its solution; difficulty is 1 (a direct translation of a formula), 2 (a derivation or an edge case
to think through) or 3 (several steps, or a derivation with SymPy, or an experiment to run and explain).
``due_week`` places the exercise in the course guide's 12-week plan.

    python -m transformer_lab.exercises.estimates     # prints the plan's load table, as the course guide has it
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Estimate:
    """One exercise: its chapter and label in the book, minutes, difficulty (1–3) and the week it is due."""

    function: str
    chapter: int
    label: str
    minutes: int
    difficulty: int
    due_week: int


# function                  chapter  label                        minutes  difficulty  due week
_TABLE = """
attention_by_hand           1  ch1-ex-by-hand                 40  2   2
attention                   1  ch1-ex-attention               25  1   2
split_heads                 1  ch1-ex-split-heads             20  2   2
one_hot_embed               1  ch1-ex-one-hot                 15  1   2
closest_scores              1  ch1-ex-closest-scores          30  2   2
superposition_gaps          1  ch1-ex-superposition           25  1   2
stable_softmax              2  ch2-ex-stable-softmax          20  1   3
softmax_jacobian_at         2  ch2-ex-softmax-jacobian        25  2   3
temperature_limit           2  ch2-ex-temperature-limit       40  3   3
top_p_filter                2  ch2-ex-top-p                   40  2   3
sequence_log_prob           2  ch2-ex-sequence-log-prob       20  1   3
chi_square_statistic        2  ch2-ex-chi-square              25  2   3
adam_step                   3  ch3-ex-adam-step               30  2   4
warmup_cosine_lr            3  ch3-ex-schedule                20  1   5
gradient_descent            3  ch3-ex-gradient-descent        20  1   4
heavy_ball                  3  ch3-ex-heavy-ball              30  2   4
inverted_dropout            3  ch3-ex-dropout                 10  1   5
dropout                     3  ch3-ex-dropout-layer           20  2   5
expected_dropout_loss       3  ch3-ex-dropout-penalty         35  2   5
sgd_epoch                   3  ch3-ex-sgd-epoch               35  2   5
expected_first_moment       3  ch3-ex-first-moment            40  3   4
sgd_step_limit              3  ch3-ex-sgd-step-limit          45  3   5
linear_grads                4  ch4-ex-linear                  25  2   5
gelu_tanh_grad              4  ch4-ex-gelu                    25  2   6
softmax_ce_grad             4  ch4-ex-softmax-ce              20  2   5
layer_norm_grad             4  ch4-ex-layer-norm              45  3   6
relu_grad                   4  ch4-ex-relu                    15  1   6
mlp_grads                   4  ch4-ex-mlp                     40  3   6
central_difference_grad     4  ch4-ex-central-difference      40  2   6
depth_gradient_norms        4  ch4-ex-depth                   40  2   6
descent_flow_rate           4  ch4-ex-descent-flow-rate       40  3   6
cross_entropy_from_logits   5  ch5-ex-cross-entropy           20  1   7
kl_div                      5  ch5-ex-kl                      15  1   7
mutual_information          5  ch5-ex-mutual-information      25  2   7
bigram_entropy              5  ch5-ex-bigram                  30  2   8
head_entropy                5  ch5-ex-head-entropy            15  1   7
processed_information       5  ch5-ex-data-processing         45  3   8
maxent_distribution         5  ch5-ex-maxent                  45  3   8
loss_units                  5  ch5-ex-units                   30  2   8
is_equivariant              6  ch6-ex-equivariant             35  2   8
sinusoidal                  6  ch6-ex-sinusoidal              20  1   8
rotation_for_offset         6  ch6-ex-rotation                35  2   8
rope                        6  ch6-ex-rope                    25  2   9
rope_score                  6  ch6-ex-rope-score              35  2   9
kv_causal_mask              6  ch6-ex-kv-mask                 15  1   9
kv_pair_count               6  ch6-ex-kv-count                15  1   9
alibi                       6  ch6-ex-alibi                   20  1   9
untrained_rows              6  ch6-ex-learned-table           35  3  10
score_drift                 6  ch6-ex-drift                   50  3  10
layer_comparison            6  ch6-ex-layers                  40  2   9
head_splits                 6  ch6-ex-head-splits             25  2   9
overflow_point              7  ch7-ex-overflow                40  3  10
stable_logsumexp            7  ch7-ex-logsumexp               20  1  10
score_variance              7  ch7-ex-score-variance          40  3  11
layer_norm_rows             7  ch7-ex-layer-norm              20  1  11
two_pass_variance           7  ch7-ex-variance                15  1  11
depth_rms                   7  ch7-ex-depth-rms               60  3  11
update_effect               7  ch7-ex-update-effect           40  3  11
trick_reason                7  ch7-ex-tricks                  35  2  11
count_params                8  ch8-ex-count-params            35  2  11
lm_windows                  8  ch8-ex-lm-windows              15  1  11
attend_with_cache           8  ch8-ex-kv-cache                25  2  12
attention_entropy           8  ch8-ex-attention-entropy       15  1  12
same_function               8  ch8-ex-same-function           30  2  11
ladder_gains                8  ch8-ex-ladder-gains            30  2  12
logit_lens                  8  ch8-ex-logit-lens              30  2  12
checkpoint                  8  ch8-ex-checkpoint              40  3  12
ngram_place                 8  ch8-ex-ngram-place             25  2  12
next_char_probs             8  ch8-ex-next-char-probs         45  3  12
"""

ESTIMATES: dict[str, Estimate] = {
    f: Estimate(f, int(ch), label, int(minutes), int(difficulty), int(week))
    for f, ch, label, minutes, difficulty, week in (line.split() for line in _TABLE.strip().splitlines())
}
"""Every exercise, by the name of the function the student writes (the key of its chapter's ``EXERCISES``)."""

MILESTONES: dict[int, tuple[str, int]] = {9: ("capstone proposal", 60), 10: ("capstone first result", 120)}
"""The capstone's graded steps before the presentation, by week: what is due and its estimate in minutes. The
capstone's own runs and the presentation (weeks 10–12) are not in the weekly sums."""

WEEKS = range(1, 13)
_DIFFICULTY = {1: "direct", 2: "some thought", 3: "several steps"}
_DIFFICULTY_ZH = {1: "直接", 2: "需要思考", 3: "多个步骤"}


def difficulty_words(difficulty: int, chinese: bool = False) -> str:
    """What a difficulty of 1, 2 or 3 means, in a few words."""
    return (_DIFFICULTY_ZH if chinese else _DIFFICULTY)[difficulty]


def note(function: str) -> tuple[str, str] | None:
    """The estimate of the exercise whose function is ``function``, as its check note shows it: English and Chinese
    (``None`` for a function with no estimate)."""
    est = ESTIMATES.get(function)
    if est is None:
        return None
    stars = "●" * est.difficulty + "○" * (3 - est.difficulty)
    return (f"about {est.minutes} min · difficulty {stars} {est.difficulty}/3 ({difficulty_words(est.difficulty)})",
            f"约 {est.minutes} 分钟 · 难度 {stars} {est.difficulty}/3（{difficulty_words(est.difficulty, True)}）")


def due(week: int) -> list[Estimate]:
    """The exercises due at the end of ``week``, in the book's order."""
    return [e for e in ESTIMATES.values() if e.due_week == week]


def week_minutes(week: int) -> int:
    """The estimated work due in ``week``: its exercises and its capstone milestone."""
    return sum(e.minutes for e in due(week)) + MILESTONES.get(week, ("", 0))[1]


def due_text(week: int) -> str:
    """What the plan's "due" column says for ``week``: each chapter with how many of its exercises are due, then
    the capstone's milestone."""
    parts = []
    for ch in sorted({e.chapter for e in due(week)}):
        n = sum(e.chapter == ch for e in due(week))
        total = sum(e.chapter == ch for e in ESTIMATES.values())
        parts.append(f"chapter {ch}: all {n}" if n == total else f"chapter {ch}: {n} of {total}")
    if week in MILESTONES:
        parts.append(MILESTONES[week][0])
    if week == 12:
        parts.append("capstone")
    return "; ".join(parts) or "—"


def load_table() -> str:
    """The course guide's table of which exercises are due each week, with the estimated minutes."""
    rows = ["| week | due at the end of the week | minutes |", "|---|---|---|"]
    for week in WEEKS:
        items = [f"{{ref}}`{e.label}` ({e.minutes})" for e in due(week)]
        if week in MILESTONES:
            items.append(f"{MILESTONES[week][0]} ({MILESTONES[week][1]})")
        if items:
            rows.append(f"| {week} | {', '.join(items)} | {week_minutes(week)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    for week in WEEKS:
        print(f"week {week:2d}: {week_minutes(week):4d} min  {due_text(week)}")
    print()
    print(load_table())
