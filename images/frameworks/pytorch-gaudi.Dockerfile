# pytorch on gaudi (gaudi).
FROM ghcr.io/cascade-ml/base-gaudi:0.1
# the base image already has it
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
