"""The request records SGLang 0.5.23 pickles in its request dump (srt/managers/io_struct.py): a
finished request's GenerateReqInput, with the fields the sandbox's /generate takes.  Unpickling a
dump needs this module importable, as the real one needs sglang."""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union


@dataclass
class GenerateReqInput:
    text: Optional[Union[List[str], str]] = None
    input_ids: Optional[Union[List[List[int]], List[int]]] = None
    sampling_params: Optional[Union[List[Dict], Dict]] = None
    rid: Optional[Union[List[str], str]] = None
    stream: bool = False
    log_metrics: bool = True


@dataclass
class ConfigureLoggingReq:  # the real one is a msgspec Struct of BaseReq (rid, http_worker_ipc first): the same repr
    rid: Optional[str] = None
    http_worker_ipc: Optional[str] = None
    log_requests: Optional[bool] = None
    log_requests_level: Optional[int] = None
    log_requests_format: Optional[str] = None
    log_level: Optional[str] = None
    dump_requests_folder: Optional[str] = None
    dump_requests_threshold: Optional[int] = None
    crash_dump_folder: Optional[str] = None
    dump_requests_exclude_meta_keys: Optional[List[str]] = None


def configure_logging_req(body: Dict[str, Any]) -> ConfigureLoggingReq:
    """The body of POST /configure_logging: the fields it names (others are not read)."""
    fields = set(ConfigureLoggingReq.__dataclass_fields__)
    return ConfigureLoggingReq(**{k: v for k, v in body.items() if k in fields})
