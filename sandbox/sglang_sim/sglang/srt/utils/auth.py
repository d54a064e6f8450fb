"""Who may call what, as SGLang 0.5.23 decides it (srt/utils/auth.py, decide_request_auth; the
levels as srt/entrypoints/http_server.py marks its routes).

- /health*, /ready*, /metrics*: anyone, whatever keys are set;
- ADMIN_OPTIONAL routes: with --admin-api-key, that key only (the api key is not taken); else with
  --api-key, that key; with neither, anyone;
- every other route (NORMAL): the api key when one is set, else anyone (an admin key alone leaves
  them open).
A refusal is 401.  A bearer token is compared in constant time.
"""
import secrets

PUBLIC_PREFIXES = ("/health", "/ready", "/metrics")
# http_server.py's @auth_level(AuthLevel.ADMIN_OPTIONAL) routes, 0.5.23
ADMIN_OPTIONAL = {
    "/set_internal_state", "/flush_cache", "/add_external_corpus", "/remove_external_corpus",
    "/list_external_corpora", "/hicache/storage-backend/clear", "/hicache/storage-backend", "/start_profile",
    "/stop_profile", "/set_trace_level", "/freeze_gc", "/start_expert_distribution_record",
    "/stop_expert_distribution_record", "/dump_expert_distribution_record", "/update_weights_from_disk",
    "/init_weights_send_group_for_remote_instance", "/send_weights_to_remote_instance",
    "/get_remote_instance_transfer_engine_info", "/remote_instance_transfer_engine_info",
    "/init_weights_update_group", "/destroy_weights_update_group", "/update_weights_from_tensor",
    "/begin_weight_update", "/end_weight_update", "/update_weights_from_distributed", "/update_weights_from_ipc",
    "/update_weight_version", "/get_weights_by_name", "/release_memory_occupation", "/resume_memory_occupation",
    "/weights_checker", "/slow_down", "/pd_role_switch", "/load_lora_adapter", "/load_lora_adapter_from_tensors",
    "/unload_lora_adapter", "/configure_logging", "/abort_request", "/pause_generation", "/continue_generation",
}


def _bearer(header, expected):
    if not header:
        return False
    parts = header.split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and secrets.compare_digest(parts[1], expected)


def allowed(method, path, authorization, api_key, admin_api_key):
    """Whether SGLang serves this request."""
    if method == "OPTIONS" or path.startswith(PUBLIC_PREFIXES):
        return True
    if path in ADMIN_OPTIONAL:
        key = admin_api_key or api_key
        return _bearer(authorization, key) if key else True
    return _bearer(authorization, api_key) if api_key else True
