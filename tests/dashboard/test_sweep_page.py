"""A density sweep in the browser: the compare page of three jobs (density 0.1, 0.2, 0.5) and its report, in
Debian's chromium. The quality-against-density figure has one series per method and one point per density; each
compare cell shows its density and cost; the report describes its jobs' settings. Screenshots go to
``bench/out/dashboard/`` (``sweep-compare.png``, ``sweep-report.png``).

No Docker: the sweep is stored through the real claim API (``tests.support.sweep_fixtures``)."""

from __future__ import annotations

import pytest

from db import connect, sqlite_url
from results.compare import compare_jobs
from tests.dashboard.conftest import start_server
from tests.support.sweep_fixtures import DENSITIES, METHODS, store_sweep

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return store_sweep(connect(sqlite_url(tmp_path_factory.mktemp("sweep-page") / "sweep.db")))


@pytest.fixture(scope="module")
def sweep_server(sweep):
    server = start_server(sweep.db.url, public=False)
    yield server
    server.stop()


def test_the_sweep_page_draws_a_curve_per_method_with_a_point_per_density(page, sweep, sweep_server, shot):
    # from the jobs page: tick the three jobs, "compare selected"
    assert page.goto(f"{sweep_server.base}/jobs").status == 200
    for job_id, density in zip(sweep.job_ids, DENSITIES, strict=True):
        row = page.locator(f'#jobs tr[data-job="{job_id}"]')
        assert row.locator("td.density").inner_text() == f"{density:g}"
        row.locator('input[type="checkbox"]').check()
    page.locator("#compare-selected-button").click()
    page.wait_for_url("**/compare?**")
    assert sorted(page.locator("h1 code.job-id").all_inner_texts()) == sorted(sweep.job_ids)
    chart = page.locator("#density-chart svg")
    series = chart.locator("g.series")
    assert sorted(series.nth(i).get_attribute("data-method") for i in range(series.count())) == sorted(
        ["dense", *METHODS]
    )
    for method in METHODS:
        points = chart.locator(f'g.point[data-method="{method}"]')
        assert sorted(float(points.nth(i).get_attribute("data-density")) for i in range(points.count())) == list(
            DENSITIES
        )
        assert chart.locator(f'g.point[data-method="{method}"] use, g.point[data-method="{method}"] path').count()
    # each cell: its density and cost as shown, equal to compare_jobs
    with sweep.db.session() as s:
        table = compare_jobs(s, sweep.job_ids)
    for row in table.rows:
        cell = page.locator(f'#compare td.cell[data-method="nexus"][data-density="{row.density!r}"]')
        want = row.cells["nexus"].cost
        assert cell.get_attribute("data-cost-mean-kv-peak-held-bytes") == repr(float(want.mean_kv_peak_held_bytes))
        line = page.locator(f'#tradeoff tr[data-method="nexus"][data-density="{row.density:g}"]')
        assert f"{100 * want.kept_fraction:.1f}%" in line.inner_text()
    assert page.locator("#cost-chart svg g.point").count() == 1 + len(METHODS) * len(DENSITIES)
    shot(page, "sweep-compare")


def test_the_sweep_report_describes_its_jobs_and_draws_the_same_curve(page, sweep, tmp_path, shot):
    from dashboard.report import write_report

    out = write_report(sweep.db.url, sweep.job_ids, tmp_path / "sweep.html")
    assert page.goto(out.as_uri(), wait_until="load") is not None
    for job_id, density in zip(sweep.job_ids, DENSITIES, strict=True):
        settings = page.locator(f'section.job-settings[data-job="{job_id}"]')
        assert settings.locator('tr[data-setting="density"] td').inner_text() == f"{density:g}"
    assert page.locator("#density-chart svg g.series").count() == 1 + len(METHODS)
    shot(page, "sweep-report")
