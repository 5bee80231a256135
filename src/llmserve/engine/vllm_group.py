"""N API processes over one vLLM engine core (server.api_processes), with vLLM's own machinery.

What `vllm serve --api-server-count N` does (vllm/entrypoints/cli/serve.py:run_multi_api_server),
with llmserve's API process as the target: the supervisor binds the engine's ZMQ listeners for N
front ends, launches the engine core (`launch_core_engines`), spawns the N API processes with
`APIServerProcessManager(target_server_fn=...)`, each with its own client address pair and its
`client_index`, and waits for the engine's start-up handshake. Each API process then connects
its own AsyncLLM (`AsyncLLM.from_vllm_config(client_addresses=, client_count=, client_index=)`).
The engine core sends its scheduler stats to one front end only, so `vllm:*` is not counted twice.
"""

from __future__ import annotations

import gc
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from llmserve.engine.step_stats import StatLoggers
from llmserve.engine.vllm_engine import (
    VllmEngine,
    apply_process_environment,
    build_engine_args,
    prepare_engine_start,
    run_async_llm,
)
from llmserve.engine_config import EngineConfig

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.engine.async_llm import AsyncLLM

SUPERVISOR_RANK = -1  # vLLM's `_api_process_rank` of the process that launches the engine core

# Target of each API process: (listen address, the shared listening socket, our arguments,
# vLLM's client config) -> None; a top-level function, since the processes are spawned.
ApiProcessTarget = Callable[[str, socket.socket, Any, dict[str, Any]], None]


@dataclass(frozen=True)
class ApiGroup:
    """The processes the supervisor watches."""

    api_processes: list[BaseProcess]
    engine_processes: list[BaseProcess]


@contextmanager
def launch_api_group(
    config: EngineConfig,
    served_model_name: str,
    count: int,
    listen_address: str,
    listening_socket: socket.socket,
    target: ApiProcessTarget,
    target_args: Any,
    shutdown_timeout_s: float,
) -> Iterator[ApiGroup]:
    """Start the engine core and `count` API processes; stop both on exit (API processes first).
    Returns once the engine core has started (its handshake), or raises if any process died."""
    from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
    from vllm.v1.executor import Executor
    from vllm.v1.utils import APIServerProcessManager

    prepare_engine_start(config)
    vllm_config = group_vllm_config(config, served_model_name, count, SUPERVISOR_RANK)
    listeners = bind_engine_zmq_listeners(vllm_config, count)
    api_manager: APIServerProcessManager | None = None
    engine_manager = None
    try:
        with launch_core_engines(
            vllm_config, Executor.get_class(vllm_config), True, listeners.addresses
        ) as launch:
            engine_manager = launch.engine_manager
            api_manager = APIServerProcessManager(
                listen_address=listen_address,
                sock=listening_socket,
                args=target_args,
                num_servers=count,
                input_listeners=listeners.inputs,
                output_listeners=listeners.outputs,
                target_server_fn=target,
                stats_update_address=(
                    launch.coordinator.get_stats_publish_address() if launch.coordinator else None
                ),
                tensor_queue=launch.tensor_queue,
            )
            # The start-up handshake (on leaving this block) aborts if an API process dies.
            launch.watched_frontend_processes = api_manager.processes
        engine_processes = list(getattr(engine_manager, "processes", []))
        yield ApiGroup(list(api_manager.processes), engine_processes)
    finally:
        if api_manager is not None:
            api_manager.shutdown(timeout=shutdown_timeout_s)
        if engine_manager is not None:
            engine_manager.shutdown(timeout=shutdown_timeout_s)
        # Now, not in its __del__ at interpreter exit (when the modules it uses are gone).
        listeners.cleanup()
        listeners.inputs.clear()
        listeners.outputs.clear()
        del listeners
        gc.collect()


@asynccontextmanager
async def connect_vllm_engine(
    config: EngineConfig, served_model_name: str, client_config: dict[str, Any]
) -> AsyncIterator[VllmEngine]:
    """In an API process of a group: connect an AsyncLLM to the group's engine core as front end
    `client_index` of `client_count` (the supervisor started the core)."""
    client = dict(client_config)
    client.pop("api_server_loads", None)  # vLLM's own accept balancing, for its own server
    count, index = client.pop("client_count"), client.pop("client_index")
    apply_process_environment(config)

    def connect(async_llm: type[AsyncLLM], stat_loggers: StatLoggers) -> AsyncLLM:
        from vllm.usage.usage_lib import UsageContext

        return async_llm.from_vllm_config(
            vllm_config=group_vllm_config(config, served_model_name, count, index),
            usage_context=UsageContext.OPENAI_API_SERVER,
            disable_log_stats=False,
            stat_loggers=stat_loggers,
            client_addresses=client,
            client_count=count,
            client_index=index,
        )

    async with run_async_llm(connect) as engine:
        yield engine


def group_vllm_config(config: EngineConfig, served_model_name: str, count: int, rank: int) -> VllmConfig:
    """vLLM's config as front end `rank` of `count` (SUPERVISOR_RANK: the supervisor's)."""
    from vllm.usage.usage_lib import UsageContext

    engine_args = build_engine_args(config, served_model_name)
    engine_args._api_process_count = count
    engine_args._api_process_rank = rank
    return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
