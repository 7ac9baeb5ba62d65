"""An OSM UpstreamTrafficSetting's connectionSettings (and outlierDetection), as the clusters
that lead to its host apply them: a mesh service's clients' clusters, or the clusters of an
Egress that names it."""

from __future__ import annotations

from datetime import timedelta

from trellis_catalog.domain.model.views import ConnectionSettings, OutlierDetection
from trellis_common.documents import osm


def seconds(duration: timedelta | None) -> float | None:
    return duration.total_seconds() if duration is not None else None


def connection_settings(name: str, spec: osm.UpstreamTrafficSettingSpec) -> ConnectionSettings:
    """An UpstreamTrafficSetting's connectionSettings as the clients' clusters apply them."""
    settings = spec.connection_settings or osm.ConnectionSettings()
    tcp = settings.tcp or osm.TCPConnectionSettings()
    http = settings.http or osm.HTTPConnectionSettings()
    return ConnectionSettings(
        policy=name,
        max_connections=tcp.max_connections,
        connect_timeout=seconds(tcp.connect_timeout),
        max_requests=http.max_requests,
        max_requests_per_connection=http.max_requests_per_connection,
        max_pending_requests=http.max_pending_requests,
        max_retries=http.max_retries,
        outlier=_outlier(spec.outlier_detection),
    )


def _outlier(detection: osm.OutlierDetection | None) -> OutlierDetection | None:
    if detection is None:
        return None
    return OutlierDetection(
        consecutive_5xx=detection.consecutive_5xx_errors,
        consecutive_gateway_errors=detection.consecutive_gateway_errors,
        interval=seconds(detection.interval),
        base_ejection_time=seconds(detection.base_ejection_time),
        max_ejection_percent=detection.max_ejection_percent,
    )
