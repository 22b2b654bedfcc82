"""The teacher's half of grading: `tformer grade` for one learner's notebooks, `tformer class grade | verify |
merge | gradescope` for a class. A notebook's `from tformer.grading import check` loads none of it.

    cli.py          the commands: `tformer grade`, `tformer class ...`, `tformer handout`, `tformer exercise new`;
                    what was typed becomes one settings.Run; one line and exit 2 on bad input
    settings.py     what a class run is: the Assignment with the run's flags applied, and RunSettings; grades.json
                    records it, verify and merge read it back
    notebooks.py    the one reader of notebook files and the one rule for which chapter's notebook a file is
    submissions.py  a class's hand-ins: student folders, a Canvas bulk download, two files for one notebook
    assignment.py   the assignment a teacher declares (--assignment FILE, TOML): notebooks, points, LMS columns,
                    a teacher's exercises, hidden cases, the due date
    late.py         due dates and late days: submission times, extensions, grace days, the penalty
    handout.py      what students get (`tformer handout`): the learner notebooks, none of the solutions
    template.py     `tformer exercise new`: a teacher's own exercise from a commented template
    runner.py       one notebook through a worker: run its cells there, judge the outputs here; the learner's
                    own `tformer grade PATH` (its table and JSON report)
    worker.py       the process that runs a learner's cells and calls their functions: the student's, every byte
                    it sends checked by the grader, never holding an answer or a teacher's file
    sandbox.py      the warm process and its forked workers: limits (64 processes, memory, files), PID, mount,
                    IPC and network namespaces, a private /proc, /dev/shm and TMPDIR, every process killed after;
                    a worker whose sandbox cannot be built runs nothing (SandboxFailed)
    landlock.py     what a worker may read and write (Landlock, through ctypes)
    cells.py        the cell plan: which cells of a class's notebook must run
    scan.py         the grader's own reading of a notebook: the released stub by syntax tree, the cells that
                    reach into the grader (flagged for the teacher)
    run.py          the class run: grade every notebook (resumable), --only, verify a recorded run, shards
    gradebook.py    the journal, grades.json, gradebook.csv, the teacher's weights and overrides, totals, merge
    feedback.py     each student's feedback page and the class report (HTML, offline)
    lms.py          the LMS exports, one Export class per LMS (Canvas, Moodle), and their rosters; an LMS file
                    this run did not write is removed from OUT
    gradescope.py   Gradescope's autograder: the zip (`tformer class gradescope`) and the run of one submission
    similarity.py   answers that look alike (a report for the teacher, never a change of grade)
"""
