"""Serving: a saved model folder as an MLflow pyfunc (DataFrame of impressions in,
probabilities out), logged as code so that nothing is pickled.

    pyfunc.py        the wrapper, its signature, logging it to the active run
    mlflow_model.py  the models-from-code entry MLflow copies into the logged model
"""
