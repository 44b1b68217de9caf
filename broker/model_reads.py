"""Reading model folders off the broker's loop: a thread pool, and the wake-up socket that brings
each result back to the loop (``run_completed``); also the load API's config and file overrides.

Auto-complete may parse a large ONNX file or run Python, so a read never runs in the loop,
which keeps routing requests meanwhile.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

from google.protobuf import json_format

from tritium.repo import LoadFailure, ModelConfig, ModelDefinition, ModelLoadError, ModelRepository
from tritium.repo.names import check_load_parameters, model_file_path, relative_file_problem, write_files
from tritium.errors import InvalidArgument

log = logging.getLogger(__name__)
T = TypeVar("T")


class MissingModel(str):
    """The error of a load asking for a model the repository does not have."""


# What reading a model folder gives: (definition, error, fingerprint, the load API's files); a
# MissingModel error for a name the repository does not have.
ModelRead = tuple["ModelDefinition | None", "str | None", tuple, "dict | None"]


class ModelReader:
    def __init__(self, repository: ModelRepository, threads: int) -> None:
        self.repository = repository
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="model-load")
        self.completed: queue.SimpleQueue = queue.SimpleQueue()
        self.wake_read, self._wake_write = socket.socketpair()
        self.wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._overrides = Path(tempfile.mkdtemp(prefix="tritium-overrides-"))

    def close(self) -> None:
        self.repository.stop_fetching()   # the process's exit waits for the pool's threads
        self._pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self._overrides, ignore_errors=True)

    def read_later(self, name: str, config, files, then: Callable[[ModelRead], None]) -> None:
        """``read`` on the pool; ``then(result)`` runs in the broker's loop."""
        self.run_later(partial(self.read, name, config, files), then)

    def run_later(self, work: Callable[[], T], then: Callable[[T], None]) -> None:
        """``work()`` on the pool (it must not raise); ``then(result)`` runs in the broker's loop."""
        future = self._pool.submit(work)
        future.add_done_callback(lambda f: self.post(lambda: then(f.result())))

    def post(self, action: Callable[[], None]) -> None:
        self.completed.put(action)
        try:
            self._wake_write.send(b"\0")
        except BlockingIOError:
            pass

    def run_completed(self) -> None:
        """In the broker's loop: apply what the thread pool finished, and what other threads posted
        (a metrics scrape's ask)."""
        try:
            self.wake_read.recv(4096)
        except BlockingIOError:
            pass
        while True:
            try:
                action = self.completed.get_nowait()
            except queue.Empty:
                return
            try:
                action()
            except Exception:  # the broker keeps serving whatever one load did
                log.exception("a task handed to the broker's loop failed")

    def read(self, name: str, config, files) -> ModelRead:
        """(definition, error, fingerprint, files): runs on the thread pool; never raises."""
        if self.repository.remote and not files:   # the model's folder as it is in the bucket now
            failure = self.repository.fetch(name)
            if failure is not None:
                return None, f"failed to load '{name}': {failure}", self.fingerprint(name), files
        fingerprint = self.fingerprint(name)
        model_dir = None
        try:
            if not files and name not in self.repository.discover()[0]:
                return None, MissingModel(f"failed to load '{name}', failed to poll from model repository"), \
                    fingerprint, files
            if files:  # the load API's files, read here; agents get them shipped
                model_dir = write_files(Path(tempfile.mkdtemp(dir=self._overrides)), name, files)
            return self.repository.load(name, config, model_dir), None, fingerprint, files
        except ModelLoadError as exc:
            return None, LoadFailure.of(exc), fingerprint, files
        except OSError as exc:
            return None, f"cannot write the files of the load request: {exc}", fingerprint, files
        except Exception as exc:  # a bug of ours must fail this load, not the broker
            log.exception("unexpected failure loading model %s", name)
            return None, f"internal error loading model '{name}': {exc!r}", fingerprint, files
        finally:
            if model_dir is not None:
                shutil.rmtree(model_dir.parent, ignore_errors=True)

    def fingerprint(self, name: str) -> tuple:
        try:
            return self.repository.fingerprint(name)
        except OSError:
            return ()


def _parsed_config(name: str, text: str) -> ModelConfig:
    """The load API's ``config``: JSON, or what Triton's reader (protobuf's C++ one) takes as
    well: object keys left unquoted, one object or value where a list is expected."""
    try:
        return json_format.Parse(text, ModelConfig(), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        for reading in {text, _with_quoted_keys(text)}:
            try:
                document = json.loads(reading)
                return json_format.ParseDict(_with_lists(document, ModelConfig.DESCRIPTOR), ModelConfig(),
                                             ignore_unknown_fields=False)
            except (ValueError, json_format.ParseError):
                pass
        raise InvalidArgument(f"failed to load '{name}': invalid 'config' parameter: {exc}") from exc


def _is_repeated(field) -> bool:
    # protobuf 6 has the property and deprecates the label; earlier ones have only the label
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED


def _with_lists(value, descriptor):
    """``value`` (a message's JSON object) with a lone item of each repeated field put in a list."""
    if not isinstance(value, dict):
        return value
    fixed = {}
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        message = field.message_type if field is not None else None
        if field is None:
            fixed[key] = item
        elif message is not None and message.GetOptions().map_entry:
            entry = message.fields_by_name["value"].message_type
            fixed[key] = {k: _with_lists(v, entry) for k, v in item.items()} if entry and isinstance(item, dict) \
                else item
        elif _is_repeated(field):
            fixed[key] = item if item is None or isinstance(item, list) else [item]
            if message is not None and isinstance(fixed[key], list):
                fixed[key] = [_with_lists(i, message) for i in fixed[key]]
        else:
            fixed[key] = _with_lists(item, message) if message else item
    return fixed


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*|\s+|.', re.S)


def _with_quoted_keys(text: str) -> str:
    """``text`` with each bare identifier that stands where an object key does (after '{' or ',',
    before ':') put in quotes; strings are left as they are."""
    tokens = [match.group() for match in _JSON_TOKEN.finditer(text)]
    significant = [i for i, token in enumerate(tokens) if not token.isspace()]
    for position, index in enumerate(significant):
        token = tokens[index]
        if not (token[0].isalpha() or token[0] == "_"):
            continue
        before = tokens[significant[position - 1]] if position else ""
        after = tokens[significant[position + 1]] if position + 1 < len(significant) else ""
        if before in ("{", ",") and after == ":":
            tokens[index] = f'"{token}"'
    return "".join(tokens)


def overrides_from(name: str, parameters: dict) -> tuple[ModelConfig | None, dict | None]:
    """The load API's ``config`` and ``file:`` parameters, checked and decoded."""
    check_load_parameters(name, parameters)
    config_text = parameters.get("config")
    files = {key[len("file:"):]: value for key, value in parameters.items() if key.startswith("file:")}
    if files and config_text is None:
        raise InvalidArgument(f"failed to load '{name}': a 'file:' override needs a 'config' parameter")
    config = None
    if config_text is not None:
        if not isinstance(config_text, str):
            raise InvalidArgument(f"failed to load '{name}': the 'config' parameter must be a JSON string")
        config = _parsed_config(name, config_text)
    decoded = {}
    for given, content in files.items():
        path = model_file_path(given)
        problem = relative_file_problem(path)
        if problem is not None:
            raise InvalidArgument(f"failed to load '{name}': file override 'file:{given}' {problem}")
        if isinstance(content, str):
            try:
                content = base64.b64decode(content, validate=True)
            except ValueError as exc:
                raise InvalidArgument(f"failed to load '{name}': 'file:{given}' is not base64") from exc
        decoded[path] = bytes(content)
    return config, decoded or None
