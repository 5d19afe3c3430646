"""The GSM8K answer reader: the final answer a completion commits to (`final_answer`), read as a
number (`numbers`: numerals and paired-unit quantities; `number_words`, `latex`, `trailers`) and
checked against the gold one (`verify`: exact fractions in-process, math-verify in a worker process).
This package imports nothing: worker processes import `grading.verify` by name and must not load the
trainer."""
