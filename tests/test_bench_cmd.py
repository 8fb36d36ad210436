"""``agentgym bench``: answers --help without the heavy imports, and refuses bad options clearly."""

from __future__ import annotations

import subprocess
import sys

from agentgym.cli.main import main


def test_bench_help_imports_nothing_heavy() -> None:
    code = (
        "import sys\nfrom agentgym.cli.main import main\ntry:\n    main(['bench', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('HEAVY' if {'torch', 'vllm', 'matplotlib', 'trio'} & set(sys.modules) else 'LIGHT')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "comparison.json" in out and "--repeats" in out and "--seeds" in out
    assert out.strip().endswith("LIGHT")


def test_bench_refuses_bad_options_with_a_message_naming_them(tmp_path, capsys) -> None:
    assert main(["bench", "--modes", "sync,fast", "--out", str(tmp_path)]) == 2
    assert "--modes 'sync,fast'" in capsys.readouterr().err
    assert main(["bench", "--seeds", "0,x", "--out", str(tmp_path)]) == 2
    assert "--seeds '0,x'" in capsys.readouterr().err
    assert main(["bench", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: no such file" in capsys.readouterr().err
    assert main(["bench", "--repeats", "2", "--seeds", "5"]) == 2
    assert "a seed per repeat" in capsys.readouterr().err
