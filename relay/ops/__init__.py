"""Operations: the Prometheus collector (collector.py), readiness and the /status document
(status.py), the HTTP endpoint (http.py), over the running parts (parts.py), wired by
service.py."""
