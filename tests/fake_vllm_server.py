"""A stand-in for vLLM's OpenAI-compatible server (standard library only), for the vllm_server engine's fast tests.

It answers /health, /v1/models, /v1/load_lora_adapter, /v1/unload_lora_adapter (reading the adapter's files, as
vLLM does, and keeping its tensors; it refuses a directory without the marker the trainer writes last, as a reader
that waits for it would) and /v1/completions (token ids drawn from the request's seed, log-prob -1.5 each, the stop
token when the seed is even). Like vLLM 0.32's OpenAI server it answers a completion with the model name asked for
(serving_completion.py: the LoRA request's name) and a request for an adapter it does not hold with 404. It can be
told to misbehave: answer slowly, refuse adapters, or die part-way through a run.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    def __init__(self) -> None:
        self.adapters: dict[str, dict] = {}  # name -> {tensor name: tensor} as read from the pushed files
        self.configs: dict[str, dict] = {}  # name -> adapter_config.json
        self.calls: list[tuple[str, dict]] = []  # (path, body) of every POST
        self.delay = 0.0  # seconds before each completion's answer
        self.refuse_loads = False
        self.die_after = -1  # completions answered before the server dies (-1: never)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path == "/health":
                    return self._send(200, "")
                models = [{"id": "base", "parent": None}] + [{"id": n, "parent": "base"} for n in fake.adapters]
                self._send(200, {"object": "list", "data": models})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.calls.append((self.path, body))
                if self.path == "/v1/completions" and fake.die_after == 0:  # dies: no answer, nothing listens after
                    threading.Thread(target=fake.stop, daemon=True).start()
                    self.close_connection = True
                    return
                fake.die_after -= self.path == "/v1/completions" and fake.die_after > 0
                status, answer = fake.answer(self.path, body)
                self._send(status, answer)

            def _send(self, status: int, answer) -> None:
                data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:  # a client gone mid-answer (the dying server's)
                pass

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, path: str, body: dict) -> tuple[int, object]:
        if path == "/v1/load_lora_adapter":
            if self.refuse_loads:
                return 400, {"error": {"message": "LoRA is not enabled", "code": 400}}
            from safetensors.torch import load_file

            if not os.path.isfile(f"{body['lora_path']}/COMPLETE"):
                return 400, {"error": {"message": f"{body['lora_path']} is not complete (no COMPLETE marker)", "code": 400}}
            self.adapters[body["lora_name"]] = load_file(f"{body['lora_path']}/adapter_model.safetensors")
            self.configs[body["lora_name"]] = json.loads(open(f"{body['lora_path']}/adapter_config.json").read())
            return 200, "Success"
        if path == "/v1/unload_lora_adapter":
            if body["lora_name"] not in self.adapters:
                return 404, {"error": {"message": f"The lora adapter '{body['lora_name']}' cannot be found.", "code": 404}}
            self.adapters.pop(body["lora_name"])
            return 200, "Success"
        if body["model"] not in self.adapters:
            return 404, {"error": {"message": f"The model `{body['model']}` does not exist."}}
        time.sleep(self.delay)
        rng = random.Random(body["seed"])
        ids = [rng.randrange(10, 60) for _ in range(body["max_tokens"])]
        if body["seed"] % 2 == 0 and body["stop_token_ids"]:
            ids = ids[: max(1, len(ids) // 2)] + [body["stop_token_ids"][0]]
        top = [{f"token_id:{t}": -1.5, "token_id:3": -0.25, "token_id:4": -0.75} for t in ids] if body["logprobs"] else None
        logprobs = {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-1.5] * len(ids), "top_logprobs": top}
        choice = {"index": 0, "text": "", "token_ids": ids, "logprobs": logprobs}
        return 200, {"model": body["model"], "choices": [choice]}

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
