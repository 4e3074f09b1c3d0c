# mindspore on huawei (cann).
FROM ghcr.io/cascade-ml/base-cann:0.1
RUN python3 -m pip install mindspore==2.3.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
