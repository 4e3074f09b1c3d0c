# spark on cpu (cpu).
FROM ghcr.io/cascade-ml/base-cpu:0.1
RUN python3 -m pip install pyspark==3.5.2 xgboost==2.1.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
