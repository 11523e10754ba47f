"""A run's evaluation: the test metrics of a trained backbone (``evaluate.py``, also
``marginface evaluate``), the evaluation during training (``epoch_evaluation.py``) and its
IJB-B/C part (``ijb_evaluation.py``), and the backbone in evaluation mode
(``backbone_evaluation.py``)."""
