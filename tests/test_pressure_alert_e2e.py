"""KvwatchKvPressure on a real Prometheus (loopback): kvwatch watching the engine stand-in under KV
pressure (preemptions every look), the alert fires with the recommended change and its expected KV
tokens in its annotations, and resolves once the pressure goes (the stand-in's load stops preempting).

The engine is the stand-in (tests/fake_engine.py) watched by `kvwatch export` on an H100 plan, where
the planner recommends an fp8 KV cache; `for:` is shortened to 1 s as in test_prometheus_e2e.py (the
real durations are promtool's, test_alerts.py) and the pressure window to kvwatch's least, 10 s.
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from engine_support import http_get
from exporter_support import samples, value
from prometheus_support import prometheus_server, rules_with_short_for
from test_export_serving import exported
from waiting import eventually


def pressure_alerts(prom) -> list[dict]:
    return [a for a in prom.firing_alerts()
            if a["labels"].get("alertname") == "KvwatchKvPressure" and a["labels"].get("engine") == "ext"]


def test_kv_pressure_alert_fires_with_its_change_and_resolves(tmp_path: Path) -> None:
    rules = rules_with_short_for(tmp_path / "rules.yml", 1)
    with exported(tmp_path, "2 100 50 0 0", "--pressure-window", "10", "--stall-timeout", "0") as (url, load, _):
        target = url.removeprefix("http://")
        preempting = threading.Event()
        preempting.set()
        stop = threading.Event()

        def serve_load() -> None:   # requests run and tokens come; preemptions while `preempting`
            step, preemptions = 0, 0
            while not stop.wait(0.25):
                step += 1
                preemptions += 1 if preempting.is_set() else 0
                load.write_text(f"2 {100 + step} {50 + 10 * step} {preemptions} {3 if preempting.is_set() else 0}")

        loader = threading.Thread(target=serve_load, daemon=True)
        loader.start()
        try:
            with prometheus_server(tmp_path / "prom", [target], rules=rules) as prom:
                assert eventually(prom.targets_up, 30, 0.5), prom.log_path.read_text()[-2000:]
                fired = eventually(lambda: pressure_alerts(prom), 60, 0.5)
                assert fired, prom.query("kvwatch_recommendation_info")
                alert = fired[0]
                assert alert["labels"]["change"] == "--kv-cache-dtype fp8", alert
                summary, description = alert["annotations"]["summary"], alert["annotations"]["description"]
                assert summary.endswith("is under KV pressure: --kv-cache-dtype fp8"), summary
                found = samples(http_get(url + "/metrics")[1])
                before = value(found, "kvwatch_recommendation_kv_tokens", engine="ext", plan="current")
                after = value(found, "kvwatch_recommendation_kv_tokens", engine="ext", plan="recommended")
                assert before is not None and after is not None and after > before
                # the expected figures, read by the annotation's own queries from the real series
                shown = re.search(r"KV tokens (\d+) now, (\d+) with the change", " ".join(description.split()))
                assert shown, description
                assert (int(shown[1]), int(shown[2])) == (before, after), (description, before, after)
                assert "preemptions per minute" in description and "kvwatch recommends --kv-cache-dtype fp8" \
                    in description, description

                time.sleep(6.0)       # a judgement later (every 5 s), the rate moved: the same alert fires on
                still = pressure_alerts(prom)
                assert [x["labels"] for x in still] == [alert["labels"]], (alert, still)

                preempting.clear()    # the pressure goes: the window empties of preemptions
                went = time.monotonic()
                assert eventually(lambda: not pressure_alerts(prom), 60, 0.5), prom.firing_alerts()
                assert time.monotonic() - went >= 5   # not before the window showed no preemption
                assert not prom.query('kvwatch_recommendation_info{engine="ext"}')
        finally:
            stop.set()
            loader.join(5)
