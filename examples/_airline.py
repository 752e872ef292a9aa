"""The airline customer-service workflow shared by ``airline_langchain.py`` and ``own_model.py``.

An in-memory airline (users, reservations, flights), four tools that return JSON, an
earlier exchange with one call per tool (it teaches a small model the argument values),
and the user's turns, each with the tool calls a correct agent makes (the plan that
steers a small model: which tool it must call).
No network: every tool reads and writes the dicts below.
"""

# No ``from __future__ import annotations``: LangChain's @tool and LlamaIndex's
# FunctionTool read these functions' annotations at run time.
import copy
import json
from typing import Annotated

from _tools import call_tool, string_tool
from pydantic import Field

AIRPORT = "^[A-Z]{3}$"
"""An airport code, as the tools declare it: three capital letters (a pattern the call's grammar holds)."""

Airport = Annotated[str, Field(pattern=AIRPORT)]

SYSTEM = ("You are an airline customer-service agent. Look up the user, their reservations and flights with "
          "the tools before you answer, and change a reservation only when the user asks for it.")

_USERS = {
    "mia_li_3668": {"name": "Mia Li", "email": "mia.li3668@example.com", "membership": "gold",
                    "reservations": ["NO6JO3", "AIXC49"], "user_id": "mia_li_3668"},
    "omar_davis_3817": {"name": "Omar Davis", "email": "omar.davis@example.com", "membership": "silver",
                        "reservations": ["JG7FMM"], "user_id": "omar_davis_3817"},
}
_RESERVATIONS = {
    "NO6JO3": {"passengers": ["Mia Li"], "cabin": "economy", "route": "JFK-SEA",
               "flights": [{"departure": "07:10", "flight_number": "HAT136", "date": "2024-05-20"}],
               "reservation_id": "NO6JO3"},
    "AIXC49": {"passengers": ["Mia Li"], "cabin": "economy", "route": "SEA-JFK",
               "flights": [{"departure": "16:05", "flight_number": "HAT271", "date": "2024-05-27"}],
               "reservation_id": "AIXC49"},
    "JG7FMM": {"passengers": ["Omar Davis"], "cabin": "business", "route": "ORD-LAX",
               "flights": [{"departure": "11:20", "flight_number": "HAT172", "date": "2024-05-18"}],
               "reservation_id": "JG7FMM"},
}
# Values the agent passes on come last in each record: a small model that copies a record's keys
# after an argument's value then closes the object, as in a call.
_FLIGHTS = [
    {"departure": "07:10", "seats_left": 3, "route": "JFK-SEA", "flight_number": "HAT136", "date": "2024-05-20"},
    {"departure": "13:45", "seats_left": 9, "route": "JFK-SEA", "flight_number": "HAT021", "date": "2024-05-20"},
    {"departure": "19:30", "seats_left": 0, "route": "JFK-SEA", "flight_number": "HAT083", "date": "2024-05-20"},
    {"departure": "08:00", "seats_left": 5, "route": "ORD-LAX", "flight_number": "HAT045", "date": "2024-05-18"},
    {"departure": "11:20", "seats_left": 2, "route": "ORD-LAX", "flight_number": "HAT172", "date": "2024-05-18"},
]


class Airline:
    """The airline's state for one run (a fresh copy each time), with the tools as methods."""

    def __init__(self) -> None:
        self.users = copy.deepcopy(_USERS)
        self.reservations = copy.deepcopy(_RESERVATIONS)
        self.calls: list[tuple[str, dict]] = []

    def get_user_details(self, user_id: str) -> str:
        """Get a user's profile and the ids of their reservations."""
        self.calls.append(("get_user_details", {"user_id": user_id}))
        user = self.users.get(user_id)
        return json.dumps(user if user else {"error": f"no user {user_id}"})

    def get_reservation_details(self, reservation_id: str) -> str:
        """Get a reservation: its route, cabin, flights and passengers."""
        self.calls.append(("get_reservation_details", {"reservation_id": reservation_id}))
        reservation = self.reservations.get(reservation_id)
        return json.dumps(reservation if reservation else {"error": f"no reservation {reservation_id}"})

    def search_direct_flight(self, origin: Airport, destination: Airport, date: str) -> str:
        """Search the direct flights from an origin to a destination airport on a date (YYYY-MM-DD)."""
        self.calls.append(("search_direct_flight", {"origin": origin, "destination": destination, "date": date}))
        found = [f for f in _FLIGHTS if (f["route"], f["date"]) == (f"{origin}-{destination}", date)]
        return json.dumps(found)

    def update_reservation_flights(self, reservation_id: str, flight_number: str, date: str) -> str:
        """Move a reservation to another flight on a date (YYYY-MM-DD)."""
        self.calls.append(("update_reservation_flights",
                           {"reservation_id": reservation_id, "flight_number": flight_number, "date": date}))
        reservation = self.reservations.get(reservation_id)
        flight = next((f for f in _FLIGHTS if (f["flight_number"], f["date"]) == (flight_number, date)), None)
        if reservation is None or flight is None:
            return json.dumps({"error": f"no reservation {reservation_id} or flight {flight_number} on {date}"})
        if flight["seats_left"] == 0:
            return json.dumps({"error": f"flight {flight_number} on {date} is full"})
        reservation["flights"] = [{"departure": flight["departure"], "flight_number": flight_number, "date": date}]
        return json.dumps({"status": "updated", **reservation})

    def tools(self) -> list:
        """The tool functions, in the order the agent sees them."""
        return [self.get_user_details, self.get_reservation_details, self.search_direct_flight,
                self.update_reservation_flights]

    def run(self, name: str, arguments: dict) -> str:
        """Execute a call by name (:func:`_tools.call_tool`)."""
        return call_tool({f.__name__: f for f in self.tools()}, TOOL_SCHEMAS, name, arguments)


TOOL_SCHEMAS = [
    string_tool("get_user_details", Airline.get_user_details.__doc__, user_id="The user's id, e.g. omar_davis_3817"),
    string_tool("get_reservation_details", Airline.get_reservation_details.__doc__,
                reservation_id="The reservation id, e.g. JG7FMM"),
    string_tool("search_direct_flight", Airline.search_direct_flight.__doc__, patterns={
        "origin": AIRPORT, "destination": AIRPORT}, origin="Origin airport code", destination="Destination airport code",
                date="Date as YYYY-MM-DD"),
    string_tool("update_reservation_flights", Airline.update_reservation_flights.__doc__,
                reservation_id="The reservation id", flight_number="The new flight number", date="Date as YYYY-MM-DD"),
]
"""The tools as OpenAI-shape schemas (for the framework-free loop)."""



def _exchange(question: str, name: str, arguments: dict, result: object, answer: str) -> list[dict]:
    call_id = f"call_{name}"
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
        {"role": "assistant", "content": answer},
    ]


EXAMPLE = [
    *_exchange("Hi, I'm omar_davis_3817. Which reservations do I have?", "get_user_details",
               {"user_id": "omar_davis_3817"}, _USERS["omar_davis_3817"], "You have one reservation: JG7FMM."),
    *_exchange("What flight is reservation JG7FMM on?", "get_reservation_details", {"reservation_id": "JG7FMM"},
               _RESERVATIONS["JG7FMM"], "Reservation JG7FMM is on flight HAT172 on 2024-05-18 at 11:20."),
    *_exchange("Which other direct flights go from ORD to LAX on 2024-05-18?", "search_direct_flight",
               {"origin": "ORD", "destination": "LAX", "date": "2024-05-18"}, _FLIGHTS[3:5],
               "Flight HAT045 leaves at 08:00 (5 seats left)."),
    *_exchange("Please move JG7FMM to flight HAT045 on 2024-05-18.", "update_reservation_flights",
               {"reservation_id": "JG7FMM", "flight_number": "HAT045", "date": "2024-05-18"},
               {"status": "updated", **_RESERVATIONS["JG7FMM"],
                "flights": [{"departure": "08:00", "flight_number": "HAT045", "date": "2024-05-18"}]},
               "Done: reservation JG7FMM is now on flight HAT045 on 2024-05-18."),
]
"""An earlier conversation (OpenAI-shape messages) that shows one call of each tool."""

# The user's turns and the calls a correct agent makes in each (name, arguments).
TURNS = [
    ("Hi, I'm mia_li_3668. Which reservations do I have?",
     [("get_user_details", {"user_id": "mia_li_3668"})]),
    ("What flight is reservation NO6JO3 on?",
     [("get_reservation_details", {"reservation_id": "NO6JO3"})]),
    ("Which other direct flights go from JFK to SEA on 2024-05-20?",
     [("search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"})]),
    ("Please move NO6JO3 to flight HAT021 on 2024-05-20.",
     [("update_reservation_flights", {"reservation_id": "NO6JO3", "flight_number": "HAT021", "date": "2024-05-20"})]),
]


def planned_tool(turn: int, calls_so_far: int) -> str | None:
    """The tool the agent calls next in ``TURNS[turn]``, or None once the turn's calls are made."""
    plan = TURNS[turn][1]
    return plan[calls_so_far][0] if calls_so_far < len(plan) else None


def planned_choice(turn: int, results_so_far: int) -> str:
    """The ``tool_choice`` that steers a small model through ``TURNS[turn]``.

    The planned tool by name while the turn still needs a call (a grammar: the reply is
    exactly one call to it, arguments valid against its schema), then ``"none"`` (the
    model answers from the results).
    """
    return planned_tool(turn, results_so_far) or "none"
