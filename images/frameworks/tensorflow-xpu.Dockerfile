# tensorflow on intel (xpu).
FROM ghcr.io/cascade-ml/base-xpu:0.1
RUN python3 -m pip install tensorflow==2.15.1 intel-extension-for-tensorflow[xpu]
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
