from django.apps import AppConfig


class ShopConfig(AppConfig):
    """The Kettlecraft demo shop's tables; below `runs`, which acts on them."""

    name = "shop"
