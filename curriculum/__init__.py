"""Curriculum: task families with difficulty levels and the controller that raises them."""
