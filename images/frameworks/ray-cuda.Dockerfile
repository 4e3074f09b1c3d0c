# ray on nvidia (cuda).
FROM ghcr.io/cascade-ml/base-cuda:0.1
RUN python3 -m pip install ray[train]==2.35.0 torch==2.4.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
