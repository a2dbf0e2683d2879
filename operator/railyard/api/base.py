"""What every TrainingJob model shares: the wire convention (camelCase, unknown fields refused)
and the field types checked as the pods' API checks them (:mod:`railyard.api.corev1`), each with
the schema pattern the CRD carries, so the API server refuses at apply time what a pod create
would refuse later."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from railyard.api import corev1
from railyard.api.quantity import NON_NEGATIVE_QUANTITY_PATTERN, parse_quantity


class ApiModel(BaseModel):
    """camelCase on the wire (Kubernetes convention), snake_case in Python; unknown fields are
    errors, as with ``kubectl apply --validate=strict``."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


def desc(text: str) -> Any:
    return Field(description=text)


# --------------------------------------------------------------------------- Kubernetes field rules
# Fields passed through to the pods are checked as the pods' API checks them (railyard.api.corev1),
# and the CRD carries the same rule as a schema pattern, so the API server refuses at apply time
# what a pod create would refuse later.


def field_rule(check: Any) -> Any:
    def run(value: str) -> str:
        problem = check(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(run)


def _quantity(value: str) -> str:
    if parse_quantity(value) < 0:  # QuantityError is a ValueError naming the value and the fix
        raise ValueError(f"{value!r}: must be greater than or equal to 0")
    return value


ResourceQuantity = Annotated[
    str,
    AfterValidator(_quantity),
    Field(min_length=1, max_length=64, json_schema_extra={"pattern": NON_NEGATIVE_QUANTITY_PATTERN}),
]
DnsSubdomain = Annotated[
    str,
    field_rule(corev1.check_dns_subdomain),
    Field(max_length=253, json_schema_extra={"pattern": corev1.DNS_SUBDOMAIN_PATTERN}),
]
LabelKey = Annotated[
    str, field_rule(corev1.check_qualified_name), Field(json_schema_extra={"pattern": corev1.QUALIFIED_NAME_PATTERN})
]
# Map keys: the same rules without a schema pattern (pydantic would turn a keyed pattern into
# patternProperties, which a structural schema does not allow; the CRD cannot check map keys).
LabelKeyOfMap = Annotated[str, field_rule(corev1.check_qualified_name)]
EnvVarNameOfMap = Annotated[str, field_rule(corev1.check_env_var_name)]
ResourceName = Annotated[str, field_rule(corev1.check_resource_name)]
LabelValue = Annotated[
    str,
    field_rule(corev1.check_label_value),
    Field(max_length=63, json_schema_extra={"pattern": corev1.LABEL_VALUE_PATTERN}),
]
EnvVarName = Annotated[
    str,
    field_rule(corev1.check_env_var_name),
    Field(min_length=1, max_length=256, json_schema_extra={"pattern": corev1.ENV_VAR_NAME_PATTERN}),
]
