# Base layer for rocm: Python, pip and an unprivileged user on the vendor's image.
FROM rocm/dev-ubuntu-22.04:6.2
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN (command -v apt-get >/dev/null && apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-pip ca-certificates && rm -rf /var/lib/apt/lists/*) || true
RUN useradd --create-home --uid 1000 cascade || true
WORKDIR /app
