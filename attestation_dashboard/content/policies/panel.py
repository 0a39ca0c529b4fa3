from django.utils.translation import gettext_lazy as _
import horizon


class Policies(horizon.Panel):
    name = _("Policies")
    slug = "attestation_policies"
    policy_rules = (("attestation", "attestation:policy:list"),)
