r"""ARPO's evaluation sets, from local copies in their published formats -> verl parquet rows, one file per set.

ARPO (after Tool-Star) keeps each benchmark as `evaluation/data/<name>/test.jsonl` (or test.json, a list), one
object per question. The sets it evaluates on, with the grading ARPO gives them:

    math: aime24, aime25, math500, gsm8k, math
    qa:   webwalker, hotpotqa, 2wiki, bamboogle, musique, hle, gaia, SimpleQA, xbench

The field names differ from set to set, as their publishers wrote them; the first one present is used:

- question: question, Question, problem, Problem, prompt, input, query;
- answer: answer, Answer, answers, golden_answers, Final answer, final_answer, gold, target (a string, a number or a
  list of accepted answers), plus answer_aliases / aliases when present (MuSiQue's); gsm8k's "... #### 72" gives 72;
  without any of these, the last \boxed{} of a `solution` (MATH's).

Each row: data_source `arpo_eval/<name>` (graded by verl/utils/reward_score/arpo_eval.py: math equivalence for math
sets, F1 for QA), a system prompt with ARPO's tags (<think>, <python>, <search>, <result>, <answer> with \boxed{}) and
the question as the user turn, ground_truth the list of accepted answers, extra_info {split: test, index (position in
the file), question, task (math / qa), dataset}; the judge of `main_eval` reads extra_info.question. Questions
without an answer are skipped (and counted).

python data/preprocess/arpo_eval.py --local_dataset_path ARPO/evaluation/data --local_save_dir ~/data/arpo_eval \
    [--datasets aime24 hotpotqa ...]     # default: every set found there
writes ~/data/arpo_eval/<name>.parquet. --local_dataset_path may also be one file when one set is given.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import _common
import pyarrow as pa
import pyarrow.parquet as pq

from verl.utils.dataset.rl_dataset import read_rows
from verl.utils.reward_score.math import last_boxed_only_string

MATH_SETS = ("aime24", "aime25", "math500", "gsm8k", "math")
QA_SETS = ("webwalker", "hotpotqa", "2wiki", "bamboogle", "musique", "hle", "gaia", "SimpleQA", "xbench")
DATA_SOURCE_PREFIX = "arpo_eval/"
QUESTION_FIELDS = ("question", "Question", "problem", "Problem", "prompt", "input", "query")
ANSWER_FIELDS = ("answer", "Answer", "answers", "golden_answers", "Final answer", "final_answer", "gold", "target")
ALIAS_FIELDS = ("answer_aliases", "aliases")
FILE_NAMES = ("test.jsonl", "test.json", "test.parquet")

SYSTEM_PROMPT = (
    "You answer questions by reasoning step by step and using tools when they help. Think inside <think> and "
    "</think>. To run Python, write the code inside <python> and </python>; to search the web, write a query inside "
    "<search> and </search>. Each tool's output comes back inside <result> and </result>. When you are done, give "
    "the final answer inside <answer> and </answer>, written as \\boxed{answer}."
)


def task_of(name: str) -> str:
    return "math" if name in MATH_SETS else "qa"


def _texts(value: Any) -> list[str]:
    """Accepted answers as a list of non-empty strings (a string, a number, or a list of them)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [text for text in (str(v).strip() for v in values if v is not None) if text]


def references(example: dict, name: str) -> list[str]:
    """The example's accepted answers (module docstring), duplicates dropped; [] when it has none."""
    field = next((f for f in ANSWER_FIELDS if example.get(f) not in (None, "", [])), None)
    if field is not None:
        answers = _texts(example[field])
        if name == "gsm8k":
            answers = [a.rsplit("####", 1)[-1].strip().replace(",", "") if "####" in a else a for a in answers]
    else:
        boxed = last_boxed_only_string(str(example.get("solution") or ""))
        answers = [boxed] if boxed else []
    for alias_field in ALIAS_FIELDS:
        answers += _texts(example.get(alias_field))
    return list(dict.fromkeys(answers))


def to_row(example: dict, name: str, index: int) -> dict:
    field = next((f for f in QUESTION_FIELDS if isinstance(example.get(f), str) and example[f].strip()), None)
    if field is None:
        raise ValueError(f"{name} example {index} has no question: none of the fields {QUESTION_FIELDS} holds text "
                         f"(fields: {sorted(example)})")
    question = example[field].strip()
    prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    return _common.rule_row(DATA_SOURCE_PREFIX + name, prompt, task_of(name), references(example, name), "test",
                            index, question=question, task=task_of(name), dataset=name)


def find_file(root: str, name: str) -> str | None:
    """`<root>/<name>/test.jsonl` (or test.json, test.parquet; the directory's name in any letter case), else
    `<root>/<name>.jsonl` / `.json` / `.parquet`."""
    if os.path.isdir(root):
        folders = [d for d in os.listdir(root) if d.lower() == name.lower() and os.path.isdir(os.path.join(root, d))]
        for folder in sorted(folders, key=lambda d: d != name):
            for file_name in FILE_NAMES:
                if os.path.isfile(path := os.path.join(root, folder, file_name)):
                    return path
        for ext in (".jsonl", ".json", ".parquet"):
            if os.path.isfile(path := os.path.join(root, name + ext)):
                return path
    return None


def convert_set(path: str, name: str) -> list[dict]:
    """The verl rows of one set's file; questions without an answer are skipped (and counted on stderr)."""
    rows = [to_row(example, name, index) for index, example in enumerate(read_rows(path))]
    kept = [row for row in rows if _common.has_answer(row)]
    if len(kept) < len(rows):
        print(f"{name}: skipped {len(rows) - len(kept)} of {len(rows)} questions without an answer", file=sys.stderr)
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dataset_path", required=True,
                        help="ARPO's evaluation/data directory (<name>/test.jsonl per set), or one set's file")
    parser.add_argument("--local_save_dir", "--local_dir", dest="local_save_dir", default="~/data/arpo_eval",
                        help="where to write <name>.parquet ('~' is expanded; default ~/data/arpo_eval)")
    parser.add_argument("--datasets", nargs="+", choices=MATH_SETS + QA_SETS, metavar="NAME",
                        help=f"sets to convert, of {' '.join(MATH_SETS + QA_SETS)} (default: every one found)")
    args = parser.parse_args(argv)
    source = os.path.expanduser(args.local_dataset_path)
    if os.path.isfile(source):
        if not args.datasets or len(args.datasets) != 1:
            print(f"--local_dataset_path {source} is one file: name its set with --datasets NAME", file=sys.stderr)
            return 1
        files = {args.datasets[0]: source}
    else:
        files = {name: find_file(source, name) for name in args.datasets or MATH_SETS + QA_SETS}
        missing = [name for name, path in files.items() if path is None]
        if (args.datasets and missing) or len(missing) == len(files):
            print(f"--local_dataset_path {source}: no file for {', '.join(missing)} (looked for <name>/"
                  f"{'|'.join(FILE_NAMES)} and <name>.jsonl|.json|.parquet)", file=sys.stderr)
            return 1
        files = {name: path for name, path in files.items() if path is not None}

    save_dir = os.path.expanduser(args.local_save_dir)
    os.makedirs(save_dir, exist_ok=True)
    for name, path in files.items():
        rows = convert_set(path, name)
        out = os.path.join(save_dir, f"{name}.parquet")
        pq.write_table(pa.Table.from_pylist(rows), out)
        print(f"wrote {out} ({len(rows)} rows, from {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
