import horizon
from django.utils.translation import gettext_lazy as _


class Policies(horizon.Panel):
    name = _("Policies")
    slug = "attestation_policies"
    policy_rules = (("attestation", "attestation:policy:list"),)
