"""Shareable reports: Markdown for issues, self-contained HTML that renders in a real browser."""

import shutil
import subprocess

import pytest

from conftest import SCRIPTS, run_cli

ANOMALY = ("--stages", "anomaly")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """One diagnosis of a late failure, written as JSON, Markdown and HTML."""
    folder = tmp_path_factory.mktemp("reports")
    script = str(SCRIPTS / "late_log_zero.py")
    md = run_cli(
        "run", script, *ANOMALY, "--report", str(folder / "r.md"), json_path=folder / "r.json"
    )
    html = run_cli("run", script, *ANOMALY, "--report", str(folder / "r.html"))
    assert md.exit_code == 1 and html.exit_code == 1, md.stderr + html.stderr
    return folder, md.report


def test_markdown_report_has_the_verdict_causes_and_a_chart(reports):
    folder, report = reports
    text = (folder / "r.md").read_text()
    assert "**NaN/Inf found: aten.log.default in data at step 6**" in text
    assert (
        "`data`" in text
        and "**Fix:** `loss = nn.functional.mse_loss(model(torch.log(batch.clamp_min(1e-12))), y)`"
        in text
    )
    assert "```mermaid\nxychart-beta" in text
    assert report["first_nonfinite"]["location"]["code"] in text


def test_html_report_is_self_contained(reports):
    folder, _ = reports
    page = (folder / "r.html").read_text()
    assert "<svg" in page and "first NaN/Inf (step 6)" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<script" not in page


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
def test_html_report_renders_in_a_headless_browser(reports, tmp_path):
    folder, _ = reports
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    page = (folder / "r.html").as_uri()
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert "First non-finite value" in dom.stdout
    assert dom.stdout.count("<polyline") >= 2  # loss and gradient-norm curves
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1000,1400", page],
                   capture_output=True, timeout=120)  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 20_000  # a real page, not a blank one
