"""`stepgap serve`: the engine behind an OpenAI-compatible HTTP server, as `vllm serve`.

It takes `stepgap run`'s engine options (engine/options.py `add_run_args`, vLLM's spellings) and
`vllm serve`'s server options (`--host`, `--port`, `--served-model-name`, `--tokenizer`,
`--uvicorn-log-level`). The HTTP front end (engine/api_server.py) runs in this process, the
engine core (engine/core_proc.py) in another, and with `--executor process` the worker in a
third, as vLLM's API server, engine core and workers.
"""

from __future__ import annotations

import argparse
import sys

from stepgap.common.errors import UserError

SERVE_DESCRIPTION = (
    "Serve the reference engine behind an OpenAI-compatible streaming server (FastAPI + "
    "uvicorn), so that the real `vllm bench serve` can drive it unchanged: one SSE chunk per "
    "engine step, usage, vLLM's /metrics.")

SERVE_EPILOG = """\
examples:
  stepgap serve checkpoints/pystdlib/target --port 8000
  stepgap serve --model checkpoints/pystdlib/target --speculative-config \\
      '{"method": "eagle3", "model": "checkpoints/pystdlib/eagle3", "num_speculative_tokens": 4}' \\
      --async-scheduling --executor process --max-model-len 256 --port 8000
  curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
      -d '{"prompt": "def main(", "max_tokens": 32, "stream": true}'
  vllm bench serve --backend vllm --base-url http://127.0.0.1:8000 --dataset-name custom \\
      --dataset-path prompts.jsonl --num-prompts 48 --max-concurrency 4 --temperature 0 \\
      --ignore-eos --save-result          # bench/serve_vllm_bench.py runs the full grid

Endpoints: POST /v1/completions (stream or not; a prompt as text or token ids, or a list of
them), POST /v1/chat/completions (with the tokenizer's chat template; a 400 where there is
none), GET /v1/models, /health (503 once the engine has died, while it is stopped, or once a
watchdog has ended it stuck), /metrics (Prometheus, vLLM's metric names), /version; with
--timeline or --result-json also POST /start_profile and /stop_profile (which `vllm bench
serve --profile` calls around its run). Bodies over 16 MiB are a 413, URLs over 8 KiB a 414.

Every request is sampled as the server's --temperature/--top-k/--top-p say (default greedy): a
request asking for other values gets a 400. A request stops at max_tokens, or at the EOS token
unless it sets ignore_eos (the benchmark does). A client that disconnects aborts its request and
frees its KV blocks. SIGINT or SIGTERM ends every stream in flight with an error, writes the
timeline and result, and stops every process within a few seconds.
"""


def register(sub) -> None:
    from stepgap.common.options import add_command, add_option
    from stepgap.engine.options import add_run_args
    p = add_command(sub, "serve", description=SERVE_DESCRIPTION, epilog=SERVE_EPILOG,
                    allow_abbrev=False,
                    help="serve the engine over HTTP with the OpenAI API, as `vllm serve`")
    p.add_argument("model_tag", nargs="?", metavar="MODEL",
                   help="the target, as `vllm serve MODEL` takes it (the same as --model)")
    add_run_args(p)
    p._option_string_actions["--max-model-len"].help = (
        "longest prompt + output, in tokens (default: the model's max_position_embeddings, as "
        "vLLM's)")
    g = p.add_argument_group("server (as `vllm serve`)")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "127.0.0.1; vLLM's default is every address)")
    g.add_argument("--port", type=port_arg, default=8000, help="1 to 65535 (default 8000)")
    g.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the model's name in the API (default: --model as given)")
    g.add_argument("--tokenizer", metavar="DIR",
                   help="the folder of tokenizer.json (default: the model's folder)")
    add_option(g, "seed", help="seeds random sampling (default 0)")
    g.add_argument("--uvicorn-log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="default warning")
    g = p.add_argument_group("recording the served traffic")
    g.add_argument("--timeline", metavar="PATH",
                   help="write the step timeline (JSON lines, every lane including "
                        "cpu.frontend; a Chrome trace beside it) at shutdown or POST "
                        "/stop_profile")
    g.add_argument("--result-json", metavar="PATH",
                   help="write the run result of the served traffic (vllm bench serve keys, "
                        "as the server saw each request, plus step_gaps, spec_decode and "
                        "config) at shutdown or POST /stop_profile")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=cmd_serve, vllm_options=True)


def cmd_serve(args) -> int:
    from stepgap.common.options import note
    from stepgap.engine.api_server import EngineClient, build_app, run_server
    from stepgap.engine.options import engine_args_from
    from stepgap.engine.loop import config_summary
    from stepgap.engine.tokenizer import ServedTokenizer

    if args.model_tag:
        if args.model and args.model != args.model_tag:
            raise UserError(f"the model is given twice ({args.model_tag} and --model "
                            f"{args.model}); give one")
        args.model = args.model_tag
    ea = engine_args_from(args)
    if ea.sampling.synthetic is not None or ea.sampling.replay:
        raise UserError("--synthetic-acceptance is not served: its draws are made per trace "
                        "(use `stepgap run`)")
    if args.max_model_len is None:   # as vLLM: the model's own context
        ea = ea.with_(max_model_len=ea.target_config().max_position_embeddings)
    setup = ea.create_engine_config()   # a head that does not fit fails here, before any
    target = setup.target               # process starts
    check_serves_a_request(setup)
    check_served_outputs(args)
    tok = ServedTokenizer.load(args.tokenizer or ea.model)
    if args.tokenizer and tok is None:
        raise UserError(f"--tokenizer {args.tokenizer}: no tokenizer.json there")
    if tok is not None and tok.vocab_size > target.vocab_size:
        raise UserError(f"the tokenizer has {tok.vocab_size} tokens but the model's vocabulary "
                        f"is {target.vocab_size}")
    name = (args.served_model_name or [ea.model])[0]
    cfg = setup.engine_config()
    record = bool(args.timeline or args.result_json)
    sock = listen_socket(args.host, args.port)   # a port in use fails now, not after the build
    engine = EngineClient(ea, tok, name, record)
    note(args, f"starting the engine core ({ea.executor} worker on {ea.device}, mode {ea.mode}, "
               f"k {ea.k}, {cfg.num_blocks} KV blocks of {ea.block_size}) ...")
    try:
        engine.start()
        info = engine.info
        note(args, f"engine core pid {info['engine_pid']}, worker pid {info['worker_pid']}; "
                   f"serving {name!r} on http://{args.host}:{args.port}"
                   + ("" if tok else " (no tokenizer: prompts as token ids)"))
        config = config_summary(cfg, ea.executor, info, served_model_name=name,
                                tokenizer=bool(tok))
        app = build_app(engine, name, ea.sampling, timeline=args.timeline,
                        result_json=args.result_json, config=config)
        run_server(app, engine, sock, args.uvicorn_log_level)
    except KeyboardInterrupt:   # SIGINT or SIGTERM, re-raised by uvicorn once it has shut down
        if engine.save_error:
            raise UserError(engine.save_error) from None
        raise
    finally:
        engine.stop()
        sock.close()
    if engine.save_error:   # bad output: the run's files could not be written where asked
        raise UserError(engine.save_error)
    if engine.dead:
        print(f"stepgap serve: the engine died: {engine.dead}", file=sys.stderr)
        return 1
    return 0


def port_arg(text: str) -> int:
    """--port: a TCP port, 1 to 65535, checked as the option is read (99999 used to time out
    after the engine's build)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {port}")
    return port


def check_serves_a_request(setup) -> None:
    """As vLLM refuses to start a server that cannot serve one request of its --max-model-len
    (the KV cache must hold it), so does stepgap serve, before any process starts: a
    --max-model-len of 1 leaves no room for an output token, and a cache of a few blocks
    (--kv-cache-gib 1e-12) holds no request of any length the server takes."""
    from stepgap.common.scheduler import cdiv
    a = setup.args
    if a.max_model_len < 2:
        raise UserError(f"--max-model-len {a.max_model_len}: a request is at least one prompt "
                        "token and one output token; give at least 2")
    need = cdiv(a.max_model_len + a.k, a.block_size)
    if need > setup.num_blocks:
        fits = setup.num_blocks * a.block_size - a.k
        raise UserError(f"--max-model-len {a.max_model_len}: one request of that length needs "
                        f"{need} KV blocks of {a.block_size} tokens, but the cache holds "
                        f"{setup.num_blocks} (--num-gpu-blocks-override, --kv-cache-gib or "
                        f"--gpu-memory-utilization); the cache serves at most --max-model-len "
                        f"{max(fits, 0)}")

def check_served_outputs(args) -> None:
    """The files a served run writes at shutdown (or /stop_profile), checked before serving as
    every run's outputs are (common/options.py check_outputs): a result that cannot be written
    would be lost with the run."""
    from stepgap.common.options import check_outputs
    from stepgap.engine.api_server import chrome_path
    timeline = args.timeline
    check_outputs(args, args.result_json, timeline and (timeline, chrome_path(timeline)))


def listen_socket(host: str, port: int):
    """The server's socket, bound before the engine is built (uvicorn then serves on it), so
    that a port in use or an address not of this machine fails in one line at once. As
    uvicorn binds: IPv6 where the host has a colon, SO_REUSEADDR."""
    import socket
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = e.strerror or str(e)
        raise UserError(f"--host {host} --port {port}: cannot listen there ({why})") from None
    return sock
