"""The request dump of SGLang 0.5.23 (srt/managers/tokenizer_manager.py: configure_logging,
dump_requests, _dump_data_to_file), for the simulator.

POST /configure_logging sets `dump_requests_folder` ("" turns the dump off) and
`dump_requests_threshold` (default 1000) on the running server, no restart.  With a folder set,
each finished request whose `log_metrics` is true is appended as (GenerateReqInput, out_dict,
created, finished), the times as wall-clock seconds; when `threshold` are held, one pickle is
written from a background thread to <folder>/%Y-%m-%d_%H-%M-%S.pkl (the folder made if missing):
a dict {"server_args": the ServerArgs object itself, keys and all, "config_updates",
"resolved_config", "requests"}.  Requests held when the dump is turned off stay held (the real one
never clears its list): the next dump anyone turns on writes them first.
A chat request is dumped as a text-only model's reaches the real dump: the templated prompt's
input_ids (serving_chat._engine_prompt; here sim_tokens.encode of the joined messages).  Every
call is logged as the real one logs it: "Config logging: obj=ConfigureLoggingReq(...)"."""
import os
import pickle
import threading
import time
from datetime import datetime

from sglang.srt.managers.io_struct import GenerateReqInput, configure_logging_req


class RequestDump:
    def __init__(self, server_args):
        self.server_args, self.folder, self.threshold = server_args, "", 1000
        self.held, self.lock = [], threading.Lock()

    def configure(self, body):
        """Apply a /configure_logging body; the request, as the server logs it ("Config logging: obj=...")."""
        req = configure_logging_req(body)
        with self.lock:
            if req.dump_requests_folder is not None:
                self.folder = req.dump_requests_folder
            if req.dump_requests_threshold is not None:
                self.threshold = req.dump_requests_threshold
        return req

    def finished(self, body, out_dict, created):
        """A /generate request that finished: held, then written when `threshold` are."""
        obj = GenerateReqInput(text=body.get("text"), input_ids=body.get("input_ids"),
                               sampling_params=body.get("sampling_params"), rid=body.get("rid"),
                               stream=bool(body.get("stream")), log_metrics=body.get("log_metrics", True))
        with self.lock:
            if not self.folder or not obj.log_metrics:
                return
            self.held.append((obj, out_dict, created, time.time()))
            if len(self.held) < self.threshold:
                return
            held, self.held = self.held, []
            filename = os.path.join(self.folder, datetime.now().strftime("%Y-%m-%d_%H-%M-%S") + ".pkl")
        data = {"server_args": self.server_args, "config_updates": [], "resolved_config": None, "requests": held}
        threading.Thread(target=self._write, args=(filename, data), daemon=True).start()

    @staticmethod
    def _write(filename, data):
        os.makedirs(os.path.dirname(filename), exist_ok=True)
        with open(filename, "wb") as f:
            pickle.dump(data, f)
