"""A tiny XGBoost job: regression on generated data, RMSE per round."""

import json
import os

import numpy as np
import xgboost as xgb

rng = np.random.default_rng(0)
features = rng.normal(size=(400, 6))
target = features @ rng.normal(size=6) + 0.1 * rng.normal(size=400)
train = xgb.DMatrix(features, label=target)
history: dict[str, dict[str, list[float]]] = {}
booster = xgb.train({"max_depth": 3, "eta": 0.3, "objective": "reg:squarederror", "nthread": 1}, train,
                    num_boost_round=int(json.loads(os.environ.get("CASCADE_HPARAMS", "{}")).get("rounds", 30)),
                    evals=[(train, "train")], evals_result=history, verbose_eval=10)
rmse = history["train"]["rmse"]
out = os.environ["CASCADE_OUTPUT_DIR"]
booster.save_model(f"{out}/model.json")
with open(f"{out}/metrics.json", "w") as f:
    json.dump({"rmse": rmse[-1], "first_rmse": rmse[0], "rank": int(os.environ.get("RANK", "0"))}, f)
