# sklearn on cpu (cpu).
FROM ghcr.io/cascade-ml/base-cpu:0.1
RUN python3 -m pip install scikit-learn==1.5.2 joblib==1.4.2
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
