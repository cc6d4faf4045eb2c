from protege.progress import Progress, duration


def test_duration_formats():
    assert duration(5.4) == "5s"
    assert duration(185) == "3m05s"
    assert duration(7440) == "2h04m"


def test_progress_reports_rate_and_time_left_at_most_every_interval():
    now = [0.0]
    lines, logged = [], []
    p = Progress("rows", 1000, lines.append, lambda v, s: logged.append((s, v)), every_s=10, clock=lambda: now[0])
    now[0] = 1.0
    p.update(100)  # first update reports: 100 rows in 1 s, 900 left at 100/s
    assert lines == ["100/1,000 rows (100.0 rows/s, 9s left)"]
    now[0] = 5.0
    p.update(100)  # 4 s after the last report: quiet
    assert len(lines) == 1
    now[0] = 11.0
    p.update(300)  # 500 rows in 11 s
    assert lines[-1] == "500/1,000 rows (45.5 rows/s, 11s left)"
    now[0] = 12.0
    p.update(500)  # the last always reports
    assert lines[-1] == "1,000/1,000 rows (83.3 rows/s, 12s in all)"
    step, values = logged[-1]
    assert step == 1000 and values["rows_done"] == 1000.0 and values["rows_left_s"] == 0.0


def test_progress_without_total_gives_no_time_left():
    lines = []
    p = Progress("answers", None, lines.append, clock=lambda: 2.0)
    p.update(4)
    assert lines == ["4 answers (0.0 answers/s)"]
