"""Names vulture reports as unused that are used by something vulture cannot see.

vulture (``make lint``) finds code that nothing calls. Each name below is called or read by a
framework, a protocol or the wire, not by our code; each says by what. Decorated routes,
validators, click commands and pytest fixtures are left out in pyproject.toml's
``[tool.vulture]`` (``ignore_decorators``) rather than listed here.
"""

# ruff: noqa: B018

from __future__ import annotations


class _Names:
    """Any attribute of it is itself: each ``_.name`` line below only mentions ``name``."""

    def __getattr__(self, name: str) -> _Names:
        return self


_ = _Names()

# Python calls a module's __getattr__ for a name the module lacks (PEP 562): trellis_cli.output's
# consoles, made on first use.
_.__getattr__

# http.server calls these by name on its handler and server classes.
_.do_GET
_.do_POST
_.do_DELETE
_.do_PUT
_.do_PATCH
_.do_HEAD
_.do_OPTIONS
_.do_CONNECT
_.do_TRACE
_.log_message
_.disable_nagle_algorithm
_.protocol_version
_.daemon_threads

# uvicorn.Server: capture_signals is overridden (uvicorn calls it), should_exit is read by it.
_.capture_signals
_.should_exit

# click reads ctx.obj for @click.pass_obj commands.
_.obj

# prometheus_client calls collect() on every registered collector.
_.collect

# Protocol parameters, named as the implementations name them (grpc's ServicerContext.abort,
# watchfiles' RustNotify.watch).
_.trailing_metadata
_.stop_event

# pydantic-settings calls this hook of a settings class, with these keyword arguments.
_.settings_customise_sources
_.env_settings
_.dotenv_settings
_.file_secret_settings

# Values of enums and fields of models parsed from operators' YAML: read by pydantic.
_.GRPC
_.HTTP2
_.TLS
_.api_group
_.enabled  # GadgetSpec in test_specdir.py
# Parsed from MeshConfig (spec.sidecar.logLevel) and tested, but proxy-cp does not apply it
# yet: a known gap, kept rather than deleted so the field is not silently dropped.
_.sidecar_log_level

# Envoy protobuf fields set by attribute (vulture sees a set, not the read by Envoy).
_.dns_lookup_family
_.lb_policy
_.forward_client_cert_details

# grpc.aio calls a server interceptor's hook (trellis_identity.authz.Authorizer).
_.intercept_service
# grpc.aio calls a client interceptor's hooks (trellis_identity.servercheck.ChannelGate).
_.intercept_unary_unary
_.intercept_unary_stream
_.intercept_stream_unary
_.intercept_stream_stream

# kmock's emulator calls its fallbacks by name (trellis_testing.kubeserver overrides them).
_._serve_create
_._serve_fetch
_._serve_update
_._serve_delete
_._serve_list
_._serve_watch

# The kubernetes client's Configuration reads its pool size when the ApiClient is made.
_.connection_pool_maxsize

# The Linkerd Destination API: gRPC calls the servicer's methods by name; profile fields are
# set by attribute (read by the client).
_.GetProfile
_.fully_qualified_name
_.opaque_protocol

# OSM's UpstreamTrafficSetting: rateLimit (local and global) is read and checked, so manifests
# load and typos are named, but not applied yet; the setting's status says so.
_.global_
_.response_status_code
_.response_headers_to_add
# socketserver calls a request handler's handle() (trellis_testing.apps.TcpApp).
_.handle

# Envoy route fields set on protobuf messages: the proxy reads them from the wire.
_.path_separated_prefix
_.scheme_redirect
_.host_redirect
_.port_redirect
_.path_redirect
_.prefix_rewrite
_.host_rewrite_literal
_.cluster_not_found_response_code

# Gateway API filter fields: pydantic fills them, _filter_field reads them by name.
_.request_redirect
_.url_rewrite

# pytest calls a conftest's hooks by name (the root conftest marks each test's kind).
_.pytest_collection_modifyitems
_.pytest_report_header
_.pytest_collection_finish
_.pytest_runtest_logreport
# click calls a group's format_commands for --help (trellis_cli.lazy.LazyGroup).
_.format_commands
# protobuf fields set on an HttpConnectionManager (translate.common.normalized)
_.merge_slashes
_.path_with_escaped_slashes_action
# logging reads it for every record (trellis_common.logs.configure sets it to None)
_._srcfile
